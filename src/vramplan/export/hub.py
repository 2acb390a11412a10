"""The model name written into launch files: a Hugging Face Hub id, never a catalog alias.

``from_pretrained``, ``vllm serve`` and TRL's ``model_name_or_path`` resolve a name as a local folder or a
Hub repository; a vramplan catalog alias (``llama3-8b``) is neither.  A catalog name or alias becomes the
row's id (each catalog id is the Hub repository its config.json was copied from, ``catalog/models/``);
``owner/name@revision`` splits into the id and the revision (``from_pretrained(revision=...)``, vLLM
``--revision``, TRL ``model_revision``); a local config.json names its folder.  An inline config mapping
names no checkpoint: it is exported under the model's name with ``is_hub=False``, and the README says to
replace it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vramplan.catalog.hub import parse_hub_id
from vramplan.catalog.models import catalog_id

__all__ = ["LaunchModel", "launch_model"]


@dataclass(frozen=True)
class LaunchModel:
    """What a launch file loads: ``name`` (Hub id or local folder), its ``revision`` (None: the default branch)."""

    name: str
    revision: str | None = None
    is_hub: bool = True
    """False for an inline config mapping (no checkpoint to name) or a local folder."""


def launch_model(model: str | dict[str, Any], fallback: str = "MODEL") -> LaunchModel:
    """The launch name of a scenario's ``model`` (see the module docstring); ``fallback`` names an inline
    mapping."""
    if isinstance(model, dict):
        return LaunchModel(str(model.get("_name_or_path") or fallback), None, is_hub=False)
    cid = catalog_id(model)
    if cid is not None:
        return LaunchModel(cid)
    path = Path(model).expanduser()
    try:
        exists = path.exists()
    except OSError:
        exists = False
    if exists:
        return LaunchModel(str(path.parent if path.is_file() else path), None, is_hub=False)
    hub = parse_hub_id(model)
    if hub is not None:
        repo, rev = hub
        return LaunchModel(repo, None if rev == "main" else rev)
    return LaunchModel(model, None, is_hub=False)
