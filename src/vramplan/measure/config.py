"""The measured scenario: its raw ``config.json`` and a smaller version of it ("shrinking").

``vramplan measure`` builds the real model from the same ``config.json`` the analytic engine
reads, so the two speak about the same tensors.  A model that does not fit on the machine at
hand (a 7B model on a laptop) can still be measured in a smaller version: fewer decoder
layers, a shorter sequence, a smaller batch.  Shrinking edits the scenario *document*, so the
prediction printed beside the measurement is the prediction for the shrunken scenario too.

No torch here: shrinking and config lookup are plain dict work.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.spec.scenario import Scenario

__all__ = ["layer_count", "raw_config", "read_scenario_document", "shrink"]

# config.json keys that hold the number of decoder layers, by family
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")


def read_scenario_document(source: str | Path | Mapping[str, Any] | Scenario) -> dict[str, Any]:
    """A scenario as a plain mapping (a deep copy: shrinking never edits the caller's object)."""
    from vramplan.spec.load import read_document

    if isinstance(source, Scenario):
        return source.model_dump(mode="json", exclude_unset=False)
    if isinstance(source, (str, Path)):
        return read_document(source)
    return copy.deepcopy(dict(source))


def raw_config(model: str | Mapping[str, Any], where: str = "model") -> dict[str, Any]:
    """The Hugging Face ``config.json`` mapping behind a model name, path or inline mapping.

    Resolution follows ``vramplan.catalog.load_model``: a catalog id or alias first, then a
    path to a ``config.json`` (or its folder), then an inline mapping, then a Hugging Face Hub id.
    """
    from vramplan.catalog.models import load_model, model_config

    if isinstance(model, Mapping):
        return copy.deepcopy(dict(model))
    load_model(model, where=where)  # raises the usual UnknownNameError with suggestions
    # a catalog row's config, a local file's, or a Hub id's from the Hugging Face cache load_model filled
    return model_config(model, where=where)


def _text_part(cfg: dict[str, Any]) -> dict[str, Any]:
    """The mapping that holds the decoder's sizes (``text_config`` of multimodal configs)."""
    text = cfg.get("text_config")
    if isinstance(text, dict) and not any(k in cfg for k in _LAYER_KEYS):
        return text
    return cfg


def layer_count(cfg: Mapping[str, Any]) -> int | None:
    """Decoder layers in a config.json mapping, or None when no known key holds them."""
    part = _text_part(dict(cfg))
    for key in _LAYER_KEYS:
        value = part.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _shrink_layers(cfg: dict[str, Any], layers: int, where: str) -> dict[str, Any]:
    """Set the decoder layer count; per-layer lists (``layer_types``) are cut to the new length."""
    out = copy.deepcopy(cfg)
    part = _text_part(out)
    old = None
    for key in _LAYER_KEYS:
        if isinstance(part.get(key), int) and not isinstance(part.get(key), bool):
            old = int(part[key])
            part[key] = layers
    if old is None:
        raise ScenarioError([Problem(where, "config.json has no layer count (num_hidden_layers or n_layer)",
                                     "measure without --layers, or give a config.json with num_hidden_layers")])
    for key, value in list(part.items()):
        if isinstance(value, list) and len(value) == old and key not in _LAYER_KEYS:
            part[key] = value[:layers]  # layer_types, per-layer window sizes, ...
    for key in ("attn_layer_indices", "mlp_only_layers"):  # Bamba's attention layers, Qwen-MoE's dense ones
        if isinstance(part.get(key), list):
            part[key] = [i for i in part[key] if isinstance(i, int) and i < layers]
    pattern = part.get("hybrid_override_pattern")  # Nemotron-H: one character a layer ("M", "*", "-")
    if isinstance(pattern, str) and len(pattern) == old:
        part["hybrid_override_pattern"] = pattern[:layers]
    for key in ("first_k_dense_replace", "max_window_layers"):
        if isinstance(part.get(key), int) and part[key] > layers:
            part[key] = layers
    return out


def attention_left(cfg: Mapping[str, Any], old: Mapping[str, Any]) -> tuple[bool, int | None]:
    """Whether a shrunk hybrid config keeps an attention layer, and the fewest layers that would (None when the
    original has none either); (True, None) for a model that is not a hybrid.  transformers' generate reads the
    cache's length from an attention layer (``Cache.get_seq_length``: "can only be called on Attention layers"), so
    a hybrid cut to its mixer layers cannot generate."""
    part, full = _text_part(dict(cfg)), _text_part(dict(old))
    if isinstance(full.get("attn_layer_indices"), list):
        first = min((i for i in full["attn_layer_indices"] if isinstance(i, int)), default=None)
        return bool(part.get("attn_layer_indices")), None if first is None else first + 1
    pattern = full.get("hybrid_override_pattern")
    if isinstance(pattern, str):
        return "*" in str(part.get("hybrid_override_pattern", "")), pattern.find("*") + 1 or None
    types = full.get("layer_types")
    if isinstance(types, list) and "mamba" in types:
        kept = part.get("layer_types") or []
        return "attention" in kept, (types.index("attention") + 1) if "attention" in types else None
    return True, None


def shrink(
    doc: Mapping[str, Any],
    *,
    layers: int | None = None,
    seq_len: int | None = None,
    micro_batch_size: int | None = None,
    batch_size: int | None = None,
    prompt_len: int | None = None,
    new_tokens: int | None = None,
) -> dict[str, Any]:
    """A copy of the scenario document with a smaller model or workload.

    ``layers`` replaces the model by its inline ``config.json`` with that many decoder layers
    (the name is kept in ``_name_or_path`` with the layer count appended); the others set
    ``train.seq_len``, ``train.micro_batch_size``, ``inference.batch_size``,
    ``inference.prompt_len`` and ``inference.new_tokens``.  Example::

        shrink({"model": "gpt2", "hardware": {"gpu": "T4"}}, layers=2, seq_len=64)
        -> model = gpt2's config.json with n_layer = 2, train.seq_len = 64
    """
    out = copy.deepcopy(dict(doc))
    problems: list[Problem] = []
    for name, value in (("--layers", layers), ("--seq-len", seq_len), ("--micro-batch-size", micro_batch_size),
                        ("--batch-size", batch_size), ("--prompt-len", prompt_len)):
        if value is not None and value < 1:
            problems.append(Problem(name, f"must be at least 1, got {value}", ""))
    if new_tokens is not None and new_tokens < 0:
        problems.append(Problem("--new-tokens", f"must be at least 0, got {new_tokens}", ""))
    if problems:
        raise ScenarioError(problems)
    if layers is not None:
        model = out.get("model")
        if not isinstance(model, (str, dict)) or not model:
            raise ScenarioError([Problem("model", "no model given", "pass a scenario with a model")])
        cfg = raw_config(model)
        name = cfg.get("_name_or_path") or (model if isinstance(model, str) else "inline")
        if isinstance(model, str):
            from vramplan.catalog import load_model

            name = load_model(model).name
        full, cfg = cfg, _shrink_layers(cfg, layers, "model")
        kept, fewest = attention_left(cfg, full)
        if not kept and out.get("task") == "inference":
            raise ScenarioError([Problem(
                "--layers", f"{layers} layers of {name} are all state-space mixers; transformers' generate needs an "
                "attention layer (its cache reads the sequence length from one)",
                f"use --layers {fewest} or more" if fewest else "measure a training step, or without --layers")])
        cfg["_name_or_path"] = f"{name} [{layers} layers]"
        out["model"] = cfg
    for section, key, value in (("train", "seq_len", seq_len), ("train", "micro_batch_size", micro_batch_size),
                                ("inference", "batch_size", batch_size), ("inference", "prompt_len", prompt_len),
                                ("inference", "new_tokens", new_tokens)):
        if value is not None:
            sec = out.setdefault(section, {})
            if not isinstance(sec, dict):
                raise ScenarioError([Problem(section, "must be a mapping", "fix the scenario file")])
            sec[key] = value
    return out
