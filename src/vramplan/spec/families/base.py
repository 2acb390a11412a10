"""What every family adapter shares: the parameter table, config-key aliases, and the ``Family`` record.

An adapter turns one family's ``config.json`` into a ``ModelSpec``: its tensors (``Params``, named as in
the family's ``modeling_*.py``, the names PEFT's ``target_modules`` match), its shape, and the ``Traits``
the engines read.  Where a key is absent the default is the one the family's ``configuration_*.py`` uses,
named in the adapter so it can be checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vramplan.spec.model import LayerSpec, ModelSpec, ParamGroup, Role, TPSplit

Config = Mapping[str, Any]

# Config-key aliases as data, in the style of transformers' ``attribute_map`` (``GPT2Config.attribute_map``:
# hidden_size -> n_embd, num_hidden_layers -> n_layer, num_attention_heads -> n_head; ``BloomConfig`` and
# ``FalconConfig`` also read the legacy ``n_embed``).  The first key present (and not null) wins.
KEY_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads",),
    "vocab_size": ("vocab_size",),
    "hidden_act": ("hidden_act", "hidden_activation"),
    "torch_dtype": ("torch_dtype", "dtype"),
}


def get(cfg: Config, *keys: str, default: Any = None) -> Any:
    """The first of ``keys`` present and not null in ``cfg`` (``default`` otherwise)."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def key(cfg: Config, name: str, default: Any = None) -> Any:
    """``name`` under any of its aliases (``KEY_ALIASES``)."""
    return get(cfg, *KEY_ALIASES.get(name, (name,)), default=default)


def prob(cfg: Config, name: str, default: float = 0.0) -> float:
    """A dropout probability; null counts as 0."""
    return float(cfg.get(name, default) or 0.0)


class Params:
    """Accumulates ParamGroup rows for one model."""

    def __init__(self) -> None:
        self.rows: list[ParamGroup] = []

    def add(self, name: str, numel: int, role: Role, layers: tuple[int, ...] = (), per_layer: int = 1,
            in_features: int = 0, out_features: int = 0, tp: TPSplit = "replicated") -> None:
        if numel <= 0:
            return
        count = per_layer * (len(layers) if layers else 1)
        if count <= 0:
            return
        module = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name.split(".")[-1]
        self.rows.append(ParamGroup(name, module, numel, count, role, in_features, out_features, tp, layers))

    def linear(self, name: str, fan_in: int, fan_out: int, layers: tuple[int, ...], bias: bool, tp: TPSplit,
               role: Role = "linear", per_layer: int = 1) -> None:
        self.add(f"{name}.weight", fan_in * fan_out, role, layers, per_layer, fan_in, fan_out, tp)
        if bias:
            # a column-parallel bias is split with its output; a row-parallel one is replicated
            btp: TPSplit = "column" if tp == "column" else ("expert" if tp == "expert" else "replicated")
            self.add(f"{name}.bias", fan_out, "bias", layers, per_layer, tp=btp)

    def norm(self, name: str, width: int, layers: tuple[int, ...], bias: bool) -> None:
        self.add(f"{name}.weight", width, "norm", layers)
        if bias:
            self.add(f"{name}.bias", width, "bias", layers)

    def attention(self, prefix: str, h: int, n_heads: int, n_kv: int, hd: int, layers: tuple[int, ...],
                  bias: bool, out: str, o_bias: bool | None = None) -> None:
        """Separate q/k/v projections (column-parallel) and the output projection ``out`` (row-parallel)."""
        self.linear(f"{prefix}.q_proj", h, n_heads * hd, layers, bias, "column")
        self.linear(f"{prefix}.k_proj", h, n_kv * hd, layers, bias, "column")
        self.linear(f"{prefix}.v_proj", h, n_kv * hd, layers, bias, "column")
        self.linear(f"{prefix}.{out}", n_heads * hd, h, layers, bias if o_bias is None else o_bias, "row")

    def lm_head(self, name: str, vocab: int, h: int, bias: bool = False) -> None:
        """An untied LM head (vocabulary-parallel), with a bias for GPT-J and phi."""
        self.add(f"{name}.weight", vocab * h, "lm_head", in_features=h, out_features=vocab, tp="vocab")
        if bias:
            self.add(f"{name}.bias", vocab, "bias", tp="vocab")


def checkpoint_dtype(cfg: Config) -> str:
    raw = str(key(cfg, "torch_dtype", default="bfloat16"))
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(raw, "bf16")


def checkpoint_quantization(cfg: Config) -> str | None:
    q = cfg.get("quantization_config")
    if not isinstance(q, Mapping):
        return None
    method = str(q.get("quant_method", "")).lower()
    if method in ("fp8", "mxfp4"):
        return method
    if method in ("gptq", "awq"):
        return f"{method}-{q.get('bits', 4)}bit"
    if method == "bitsandbytes":
        return "nf4" if q.get("load_in_4bit") else "int8"
    return method or None


def build_spec(cfg: Config, name: str, model_type: str, p: Params, *, windows: list[int | None] | None = None,
               moe_layers: frozenset[int] = frozenset(), **fields: Any) -> ModelSpec:
    """The ``ModelSpec`` of an adapter: ``fields`` are ModelSpec's own field names (no renaming).

    Defaults are those of a plain pre-norm decoder: no gating, LayerNorm, sequential residual, no q/k norm,
    no sandwich norms, head_dim = hidden / heads.  ``windows``: sliding window per layer (None: full).
    """
    n, inter = int(fields["num_layers"]), int(fields["intermediate_size"])
    win = windows or [None] * n
    layers = tuple(LayerSpec(i, i in moe_layers, 0 if i in moe_layers else inter, win[i]) for i in range(n))
    spec: dict[str, Any] = {"mlp_gated": False, "norm": "layer", "parallel_residual": False, "qk_norm": False,
                            "sandwich_norms": False,
                            "head_dim": int(fields["hidden_size"]) // int(fields["num_attention_heads"])}
    spec.update(fields)
    return ModelSpec(name=name, model_type=model_type, layers=layers, params=tuple(p.rows),
                     checkpoint_dtype=checkpoint_dtype(cfg), checkpoint_quantization=checkpoint_quantization(cfg),
                     **spec)


Builder = Callable[[Config, str, str], ModelSpec]  # (config, model_type, name) -> ModelSpec


@dataclass(frozen=True)
class Family:
    """One family's adapter: how its config.json becomes a ``ModelSpec``, and which transformers code it follows.

    ``required``: keys the config must hold, each a tuple of accepted spellings (the first is named in errors).
    ``transformers_model_type``: the transformers ``model_type`` whose configuration and causal-LM classes
    build this family (None: its own); the traced engine and ``measure`` instantiate that class.
    ``drop_null_keys``: keys a config may hold as null that the transformers configuration class rejects.
    ``torchtitan_model``: torchtitan's name for the family where torchtitan ships it (its ``torchtitan/models/``).
    """

    build: Builder
    modeling: str
    required: tuple[tuple[str, ...], ...] = (("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",),
                                             ("vocab_size",))
    transformers_model_type: str | None = None
    drop_null_keys: tuple[str, ...] = ()
    torchtitan_model: str | None = None


def required(*keys: str) -> tuple[tuple[str, ...], ...]:
    """``Family.required`` from plain key names (one spelling each)."""
    return tuple((k,) for k in keys)
