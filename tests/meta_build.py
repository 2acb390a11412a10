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


def tower_totals(module: Any, language_model: str = "model.language_model.", only: str = "model.") -> dict[str, int]:
    """Parameters of the module outside its language model, summed per name with the layer indices dropped
    (``vision_tower.encoder.layers.self_attn.q_proj.weight``): the tower and projector rows the adapters list.
    ``only`` keeps the names under that prefix, ``language_model`` drops those under it."""
    out: dict[str, int] = {}
    for name, p in module.named_parameters():
        if name.startswith(only) and not name.startswith(language_model):
            key = ".".join(x for x in name.removeprefix("model.").split(".") if not x.isdigit())
            out[key] = out.get(key, 0) + p.numel()
    return out


def assert_equals_meta_module(spec: Any, cfg: dict[str, Any], **tower: str) -> None:
    """The adapter's model ``spec`` of ``cfg`` against transformers' module on the meta device: the parameter
    count, and the tower and projector rows name by name (``tower``: ``tower_totals``' prefixes)."""
    module = meta_module(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters())
    theirs = tower_totals(module, **tower)
    assert spec.vision is not None
    assert {p.name: p.total for p in spec.params if p.name.startswith(spec.vision.param_prefixes)} == theirs
