"""Model lookup: catalog id or alias, a config.json path (file or folder), or an inline mapping."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from vramplan.errors import Problem, ScenarioError, UnknownNameError, suggest
from vramplan.spec.hf_config import model_from_config
from vramplan.spec.load import MAX_PATH_CHARS, parse_text, read_bounded_text
from vramplan.spec.model import ModelSpec


@dataclass(frozen=True)
class CatalogModel:
    id: str
    aliases: tuple[str, ...]
    source: str
    revision: str
    published_parameters: int | None
    parameters_source: str | None
    config: dict[str, Any]
    notes: str = ""


def _norm(name: str) -> str:
    return name.strip().lower()


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, CatalogModel], dict[str, str]]:
    by_id: dict[str, CatalogModel] = {}
    index: dict[str, str] = {}
    folder = resources.files("vramplan.catalog").joinpath("models")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".json"):
            continue
        raw = json.loads(entry.read_text(encoding="utf-8"))
        m = CatalogModel(
            id=raw["id"], aliases=tuple(raw.get("aliases", ())), source=raw["source"],
            revision=str(raw.get("revision", "")), published_parameters=raw.get("published_parameters"),
            parameters_source=raw.get("parameters_source"), config=raw["config"], notes=str(raw.get("notes", "")),
        )
        by_id[m.id] = m
        for key in (m.id, m.id.split("/")[-1], *m.aliases):
            index.setdefault(_norm(key), m.id)
    return by_id, index


def catalog_id(name: str) -> str | None:
    """The catalog id (the Hub repository id) that ``name`` spells (an id, its short name or an alias), else None.

    >>> catalog_id("llama3-8b")
    'meta-llama/Meta-Llama-3-8B'
    """
    return _catalog()[1].get(_norm(name))


def model_ids() -> list[str]:
    return sorted(_catalog()[0])


def list_models(query: str | None = None) -> list[CatalogModel]:
    by_id, _ = _catalog()
    rows = [by_id[k] for k in sorted(by_id)]
    if query:
        q = _norm(query)
        rows = [m for m in rows if q in _norm(m.id) or any(q in _norm(a) for a in m.aliases)
                or q in str(m.config.get("model_type", ""))]
    return rows


def _from_path(path: Path, where: str) -> ModelSpec:
    file = path / "config.json" if path.is_dir() else path
    if not file.exists():
        raise ScenarioError([Problem(where, f"{path} has no config.json", "point at a config.json or its folder")])
    # bounded: a device (/dev/zero), a huge or deeply nested file is refused before parsing
    cfg = parse_text(read_bounded_text(file, where), ".json", where, str(file))
    if not isinstance(cfg, dict):
        raise ScenarioError([Problem(where, f"{file} is not a JSON object", "give a valid config.json")])
    # a config.json is named by its folder (a Hub snapshot's or a model directory's); any other file by its own name
    named = (file.parent.name if file.name == "config.json" else file.stem) or file.stem
    return model_from_config(cfg, name=str(cfg.get("_name_or_path") or named), where=where)


def _text_part_of_multimodal(config: dict[str, Any], spec: ModelSpec) -> str:
    """A catalog row whose config is a multimodal checkpoint's language model alone (a ``*_text`` model type under
    a ``*ForConditionalGeneration`` architecture, as the Gemma 3 ``-pt`` rows are written): ``from_pretrained`` of
    that checkpoint also loads its vision tower and projector, which the row does not describe.  Said, never
    dropped silently (the band widens)."""
    archs = [str(a) for a in config.get("architectures") or []]
    multimodal = next((a for a in archs if a.endswith("ForConditionalGeneration")), "")
    if not (multimodal and str(config.get("model_type", "")).endswith("_text") and spec.vision_parameters == 0):
        return ""
    return (f"not modelled: {spec.name}'s checkpoint is a {multimodal} (a vision-language model) and its catalog "
            "row describes the language model only: the vision tower and multi-modal projector the checkpoint holds "
            "are not counted (Gemma 3's SigLIP tower and projector are about 0.42 B parameters; a row with the "
            "checkpoint's vision_config, such as google/gemma-3-4b-it, counts them)")


# catalog rows' specs by (row id, where), with the row they were built from (``load_model``)
_CATALOG_SPECS: dict[tuple[str, str], tuple[Any, ModelSpec]] = {}


def load_model(model: str | dict[str, Any], where: str = "model", offline: bool = False) -> ModelSpec:
    """Resolve any accepted spelling of a model to a ``ModelSpec``: a catalog id or alias, a local config.json
    (file or folder), an inline mapping, then a Hugging Face Hub id ``owner/name[@revision]`` read through the
    Hugging Face cache (``catalog/hub.py``; ``offline``: from the cache only, as ``HF_HUB_OFFLINE=1``)."""
    if isinstance(model, dict):
        return model_from_config(model, name=str(model.get("_name_or_path", "inline")), where=where)
    by_id, index = _catalog()
    key = index.get(_norm(model))
    if key is not None:
        m = by_id[key]
        # a catalog row's spec is built once per process (a frozen record; the planner resolves each setup it shows,
        # and compares the spec with its own, which the same object answers at once)
        held = _CATALOG_SPECS.get((key, where))
        if held is not None and held[0] is m:
            return held[1]
        spec = model_from_config(m.config, name=m.id, where=where)
        spec = _with_source(spec, m.source)
        dropped = _text_part_of_multimodal(m.config, spec)
        spec = replace(spec, source_notes=(*spec.source_notes, dropped)) if dropped else spec
        _CATALOG_SPECS[(key, where)] = (m, spec)
        return spec
    path = Path(model).expanduser()
    try:
        exists = len(model) <= MAX_PATH_CHARS and path.exists()
    except OSError:  # a name the file system refuses (too long a component, say) names no file
        exists = False
    if exists:
        return _from_path(path, where)
    if model.endswith(".json") or "/" in model and model.startswith((".", "/", "~")):
        raise ScenarioError([Problem(where, f"no such file: {model}", "check the path to config.json")])
    from vramplan.catalog.hub import HubOptions, hub_model_spec, parse_hub_id

    if parse_hub_id(model) is not None:
        # not a catalog name nor a file: owner/name is read from the Hub (the cache first)
        return hub_model_spec(model, HubOptions(offline=offline), where, suggest(model, list(index)))
    raise UnknownNameError("model", model, list(index), where)


def model_config(model: str | dict[str, Any], offline: bool = False, where: str = "model",
                 copy_: bool = True) -> dict[str, Any]:
    """The config.json mapping behind any spelling ``load_model`` accepts (a copy): the catalog row's, a local
    file's, an inline mapping, or a Hub id's as the Hugging Face cache holds it (``catalog/hub.py``).
    ``copy_=False``: an inline mapping or a catalog row's config itself, for a caller that only reads it (the
    serving engine reads a key or two on every estimate; a deep copy cost more than the rest of those reads)."""
    import copy

    if isinstance(model, dict):
        return copy.deepcopy(model) if copy_ else model
    by_id, index = _catalog()
    key = index.get(_norm(model))
    if key is not None:
        return copy.deepcopy(by_id[key].config) if copy_ else by_id[key].config
    from vramplan.catalog.hub import HubOptions, fetch_hub_model, parse_hub_id

    path = Path(model).expanduser()
    try:
        exists = len(model) <= MAX_PATH_CHARS and path.exists()
    except OSError:
        exists = False
    if not exists and parse_hub_id(model) is not None:
        return copy.deepcopy(fetch_hub_model(model, HubOptions(offline=offline)).config)
    file = path / "config.json" if path.is_dir() else path
    cfg = parse_text(read_bounded_text(file, where), ".json", where, str(file))
    if not isinstance(cfg, dict):
        raise ScenarioError([Problem(where, f"{file} is not a JSON object", "give a valid config.json")])
    return cfg


def _with_source(spec: ModelSpec, source: str) -> ModelSpec:
    from dataclasses import replace

    return replace(spec, source=source)
