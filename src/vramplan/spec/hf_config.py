"""The one entry from a Hugging Face ``config.json`` to a ``ModelSpec``.

Each family's adapter lives in ``vramplan.spec.families`` (one module per family, named after the
transformers ``modeling_*.py`` it follows); ``FAMILIES`` maps a config's ``model_type`` to it.  This module
validates what every family shares (a known ``model_type``, the required keys, positive sizes) and hands
the config to the adapter.

Supported ``model_type`` values are in ``SUPPORTED_MODEL_TYPES`` (the registry at import; a family
registered later in ``FAMILIES`` is accepted too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vramplan.errors import Problem, ScenarioError
from vramplan.spec.families import FAMILIES, Family, flatten_text_config
from vramplan.spec.model import ModelSpec
from vramplan.spec.vision_quant import with_tower_quantization

__all__ = ["MAX_SIZE", "SUPPORTED_MODEL_TYPES", "model_from_config"]

SUPPORTED_MODEL_TYPES = tuple(sorted(FAMILIES))
# The largest published sizes are far below it (hidden 16,384 and 126 layers for Llama 3.1 405B, a vocabulary of
# 262,144 for Gemma 3): products of sizes beyond it overflow the 64-bit byte counts of the allocator replay.
MAX_SIZE = 1 << 20
# sizes that must be positive integers, under every family's spelling
_POSITIVE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size",
             "n_embd", "n_layer", "n_head", "d_model", "n_layers", "n_heads")


def _family(cfg: Mapping[str, Any], where: str) -> tuple[str, Family]:
    model_type = cfg.get("model_type")
    supported = tuple(sorted(FAMILIES))
    if not isinstance(model_type, str):
        raise ScenarioError([Problem(where, "config.json has no 'model_type'", f"add one of: {', '.join(supported)}")])
    fam = FAMILIES.get(model_type)
    if fam is None:
        from vramplan.errors import suggest

        close = suggest(model_type, supported)
        hint = f"did you mean {', '.join(close)}?" if close else f"supported: {', '.join(supported)}"
        raise ScenarioError([Problem(where, f"model_type {model_type!r} is not supported", hint)])
    return model_type, fam


def _check(cfg: Mapping[str, Any], model_type: str, fam: Family, where: str) -> None:
    missing = [spellings[0] for spellings in fam.required if not any(k in cfg for k in spellings)]
    if missing:
        raise ScenarioError(
            [Problem(where, f"config.json of model_type {model_type!r} lacks required key(s) {', '.join(missing)}",
                     "give a complete config.json as the model's Hugging Face repository has it")]
        )
    bad = [k for k in _POSITIVE if k in cfg and not all(_positive(v) for v in _sizes(k, cfg[k]))]
    if bad:
        raise ScenarioError([Problem(f"{where}.{k}", f"must be a positive integer, got {cfg[k]!r}",
                                     "fix the config.json") for k in bad])
    huge = [k for k in _POSITIVE if k in cfg and max(_sizes(k, cfg[k])) > MAX_SIZE]
    if huge:
        raise ScenarioError([Problem(f"{where}.{k}", f"{max(_sizes(k, cfg[k])):,} is beyond any model's size (at most "
                                     f"{MAX_SIZE:,})", "fix the config.json") for k in huge])


def _positive(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _sizes(key: str, value: Any) -> list[Any]:
    """The sizes a key holds: Gemma 3n's ``intermediate_size`` may be a non-empty list, one width per layer
    (``Gemma3nTextConfig``, transformers 5.24 configuration_gemma3n.py:97 and :129-138)."""
    if key == "intermediate_size" and isinstance(value, list) and value:
        return value
    return [value]


def model_from_config(config: Mapping[str, Any], name: str = "custom", where: str = "model") -> ModelSpec:
    """Build a ``ModelSpec`` from a config.json mapping; raises ScenarioError with every problem."""
    try:
        cfg = flatten_text_config(config)
        model_type, fam = _family(cfg, where)
        _check(cfg, model_type, fam, where)
        # which of a vision tower's linears the checkpoint stores quantized (spec/vision_quant.py)
        spec = with_tower_quantization(fam.build(cfg, model_type, name))
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        # a config.json is untrusted input: a field of the wrong type or value that an adapter cannot read
        # (``attention_dropout: ":"``, a list where a size goes) is the user's problem to fix, not a crash
        raise ScenarioError([Problem(where, f"config.json has a value the {config.get('model_type')!s} adapter "
                                     f"cannot read ({type(exc).__name__}: {str(exc)[:200]})",
                                     "give the config.json as the model's Hugging Face repository has it")]) from None
    if spec.moe is not None and not 1 <= spec.moe.top_k <= spec.moe.num_experts:
        # every MoE term divides by the expert count or picks top_k of them (``num_active_parameters``); a nested
        # config (Qwen3-Omni's thinker_config.text_config) reaches here past the top level's checks
        raise ScenarioError([Problem(where, f"config.json has {spec.moe.num_experts} routed experts with "
                                     f"{spec.moe.top_k} chosen per token: a mixture-of-experts model needs at least "
                                     "one expert and 1 <= top_k <= the expert count",
                                     "give the config.json as the model's Hugging Face repository has it")])
    return spec
