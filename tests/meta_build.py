"""A transformers module built on the meta device from a config mapping: the oracle the family adapters'
parameter counts are checked against (no weights, no network)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest


def meta_module(cfg: dict[str, Any], auto: str = "AutoModelForImageTextToText") -> Any:
    """``transformers.<auto>.from_config(AutoConfig.for_model(**cfg))`` on the meta device; skips without torch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.AutoConfig.for_model(**cfg)
        with torch.device("meta"):
            return getattr(transformers, auto).from_config(config)
