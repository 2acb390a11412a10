"""Mamba (``mamba``) and FalconMamba (``falcon_mamba``): stacks of Mamba-1 mixers without attention or MLP
(transformers ``modeling_mamba.py`` and ``modeling_falcon_mamba.py``, 5.24).

``MambaModel`` holds ``embeddings``, ``num_hidden_layers`` blocks (``MambaBlock``: one ``MambaRMSNorm`` ``norm`` and
one ``MambaMixer`` ``mixer``) and ``norm_f``; ``MambaForCausalLM`` adds ``lm_head``, tied to ``backbone.embeddings``
when ``tie_word_embeddings`` (``_tied_weights_keys``).  ``MambaMixer.__init__``, with ``I = intermediate_size``
(the config's own where it has one, else ``expand x hidden_size``: ``mixer_spec``), ``n = state_size``,
``r = time_step_rank`` (``"auto"``: ``ceil(hidden_size / 16)``) and ``k = conv_kernel``:

* ``conv1d``: depthwise ``nn.Conv1d(I, I, k, groups=I)``, weight ``[I, 1, k]``, bias ``[I]`` when ``use_conv_bias``;
* ``in_proj``: ``[2 I, hidden]`` (x and the gate z), bias when ``use_bias``;
* ``x_proj``: ``[r + 2 n, I]`` without bias (dt's low-rank input, B and C);
* ``dt_proj``: ``[I, r]`` with bias;
* ``A_log`` ``[I, n]`` and ``D`` ``[I]``;
* ``out_proj``: ``[hidden, I]``, bias when ``use_bias``.

``FalconMambaMixer`` adds ``dt_layernorm``, ``b_layernorm`` and ``c_layernorm`` (``FalconMambaWeightlessRMSNorm``),
whose ``weight`` is a non-persistent buffer (``nn.Buffer(..., persistent=False)``), not a parameter: no row here (their
``I + 2 n`` elements per layer are left out of the weights; the inference notes say so).  ``MambaBlock``
(and ``FalconMambaBlock``) cast the residual to fp32 when ``residual_in_fp32`` (``Traits.residual_in_fp32``).

``configuration_mamba.py`` / ``configuration_falcon_mamba.py`` defaults: vocab 50280, hidden 768, state_size 16,
32 layers, expand 2, conv_kernel 4, use_bias False, use_conv_bias True, residual_in_fp32 True, time_step_rank "auto",
tie_word_embeddings True.
"""

from __future__ import annotations

import math
from dataclasses import replace

from vramplan.spec.families.base import Config, Family, Params, build_spec, get, required
from vramplan.spec.families.mamba2 import MAX_POSITIONS
from vramplan.spec.model import MambaSpec, ModelSpec


def time_step_rank(cfg: Config, h: int) -> int:
    """``MambaConfig.__post_init__``: ``math.ceil(hidden_size / 16)`` for "auto", else the config's value."""
    r = get(cfg, "time_step_rank", default="auto")
    return math.ceil(h / 16) if r == "auto" else int(r)


def mixer_spec(cfg: Config, h: int, n_layers: int, bc_dt_norms: bool) -> MambaSpec:
    """The Mamba-1 mixers' shape (``MambaSpec.kind`` "mamba1": one head of width 1 per channel, no groups)."""
    # MambaConfig.__post_init__ sets intermediate_size = expand x hidden_size, then PreTrainedConfig.__post_init__
    # sets the config's other keys: a config.json's own intermediate_size wins (falcon-mamba-7b's says 8192 beside an
    # expand of 16; MambaMixer reads config.intermediate_size)
    inter = int(cfg.get("intermediate_size") or int(get(cfg, "expand", default=2)) * h)
    return MambaSpec(layers=tuple(range(n_layers)), n_heads=inter, head_dim=1, n_groups=0,
                     state_size=int(get(cfg, "state_size", default=16)),
                     conv_kernel=int(get(cfg, "conv_kernel", default=4)), intermediate_size=inter, chunk_size=1,
                     kind="mamba1", time_step_rank=time_step_rank(cfg, h), bc_dt_norms=bc_dt_norms)



def mamba1_mixer_params(p: Params, prefix: str, h: int, inter: int, conv_kernel: int, dt_rank: int, state: int,
                        layers: tuple[int, ...], conv_bias: bool, proj_bias: bool) -> None:
    """A Mamba-1 mixer's tensors (transformers 5.24 ``MambaMixer``, and Jamba's, which holds the same ones):
    conv1d over the inner width, in_proj to twice it, x_proj to dt rank + 2 x state, dt_proj back, A_log, D,
    out_proj."""
    p.add(f"{prefix}.conv1d.weight", inter * conv_kernel, "other", layers)
    if conv_bias:
        p.add(f"{prefix}.conv1d.bias", inter, "bias", layers)
    p.linear(f"{prefix}.in_proj", h, 2 * inter, layers, proj_bias, "column")
    p.linear(f"{prefix}.x_proj", inter, dt_rank + 2 * state, layers, False, "replicated")
    p.linear(f"{prefix}.dt_proj", dt_rank, inter, layers, True, "replicated")
    p.add(f"{prefix}.A_log", inter * state, "other", layers)
    p.add(f"{prefix}.D", inter, "other", layers)
    p.linear(f"{prefix}.out_proj", inter, h, layers, proj_bias, "row")

def build(cfg: Config, model_type: str, name: str) -> ModelSpec:
    if cfg.get("use_mambapy") or cfg.get("use_falcon_mambapy"):
        # mamba_selective_scan: with use_mambapy and the mambapy package, pscan over the whole sequence replaces the
        # recurrent loop whose tensors analytic/ssm_state.py counts (FalconMambaConfig reads use_falcon_mambapy too)
        raise ValueError(f"a {model_type} config with use_mambapy (mambapy's parallel scan) is not modelled: the "
                         "torch recurrent loop is (set use_mambapy: false)")
    h, n_layers, vocab = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["vocab_size"])
    # FalconMambaMixer's norms on dt, B and C (no parameters: their weights are non-persistent buffers)
    ms = mixer_spec(cfg, h, n_layers, model_type == "falcon_mamba")
    inter, n, r, layers = ms.intermediate_size, ms.state_size, ms.time_step_rank, ms.layers
    use_bias = bool(get(cfg, "use_bias", default=False))
    p = Params()
    p.add("embeddings.weight", vocab * h, "embedding", tp="vocab")
    p.norm("layers.norm", h, layers, False)
    mamba1_mixer_params(p, "layers.mixer", h, inter, ms.conv_kernel, r, n, layers,
                        bool(get(cfg, "use_conv_bias", default=True)), use_bias)
    p.norm("norm_f", h, (), False)
    tied = bool(cfg.get("tie_word_embeddings", True))
    if not tied:
        p.lm_head("lm_head", vocab, h)
    spec = build_spec(cfg, name, model_type, p, hidden_size=h, num_layers=n_layers, num_attention_heads=1,
                      num_kv_heads=1, head_dim=h, vocab_size=vocab, intermediate_size=0,
                      hidden_act=str(cfg.get("hidden_act", "silu")), mlp_gated=False, norm="rms", position="none",
                      tie_word_embeddings=tied, attention_dropout=0.0, hidden_dropout=0.0,
                      max_position_embeddings=MAX_POSITIONS, mamba=ms)
    # peft 0.21 tuners_utils.py _check_lora_target_modules_mamba: out_proj and conv1d of mamba, mamba2 and falcon_mamba
    return replace(spec, traits=replace(spec.traits, residual_in_fp32=bool(get(cfg, "residual_in_fp32", default=True)),
                                        peft_refused_targets=("out_proj", "conv1d")))


_REQUIRED = required("hidden_size", "num_hidden_layers", "vocab_size")
MAMBA = Family(build, "modeling_mamba.py", required=_REQUIRED)
FALCON_MAMBA = Family(build, "modeling_falcon_mamba.py", required=_REQUIRED)
