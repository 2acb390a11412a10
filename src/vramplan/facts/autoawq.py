"""AutoAWQ releases whose fused-module inference is modelled (``framework: autoawq``), as data.

AutoAWQ (github.com/casper-hansen/AutoAWQ) runs a pre-quantized AWQ checkpoint through its own fused modules when
``AutoAWQForCausalLM.from_quantized(..., fuse_layers=True)`` (the default of every release here): a fused q/k/v
``WQLinear_GEMM``, ``FasterTransformerRMSNorm``, and ``QuantAttentionFused``, whose ``WindowedCache`` preallocates
every layer's fp16 K and V for ``max_seq_len`` positions (``analytic/autoawq.py`` derives the bytes).  What differs
between the releases read here, each at its tag:

* **the window's argument and default.**  0.1.6-0.1.8: ``from_quantized(max_new_tokens=None)``; ``None`` takes the
  model class's ``max_new_tokens_key`` from the config (``max_position_embeddings`` for llama and mistral:
  4,096 for Llama-2, 32,768 for Mistral-7B), ``awq/models/base.py`` ``_load_config`` (0.1.8 adds a 2,048
  fallback when the key is missing).  0.2.0-0.2.3: ``from_quantized(max_seq_len=2048)`` (``awq/models/auto.py``);
  a ``max_new_tokens`` keyword is mapped onto ``max_seq_len`` with a deprecation warning.
* **the MLP.**  0.1.x fuse it (``awq/modules/fused/mlp.py`` ``QuantLlamaMLP``/``QuantFusedMLP``: gate and up
  outputs bound to locals, ``gemm_forward_cuda`` at every length); 0.2.x keep transformers' ``LlamaMLP`` with
  ``WQLinear_GEMM`` linears (``awq/models/llama.py`` ``LlamaFuser``: ``mlp=module.mlp``).
* **when the model reaches the GPU.**  0.1.6 ``from_quantized`` runs ``load_checkpoint_in_model`` (checkpoint
  tensors only), ``fuse_layers``, then ``dispatch_model``; from 0.1.7 ``load_checkpoint_and_dispatch`` moves the
  whole transformers model to the GPU before fusing, its non-persistent buffers too (transformers' per-attention
  rotary ``cos_cached``/``sin_cached``).
* **the GEMM kernel.**  0.2.x ``WQLinearMMFunction.forward`` (``awq/modules/linear/gemm.py``) dequantizes the whole
  weight to fp16 and runs ``torch.matmul`` when ``x.shape[0] * x.shape[1] >= 1024``
  (``FP16_MATMUL_HEURISTIC_CONDITION``); 0.1.x ``WQLinear_GEMM.forward`` always runs ``gemm_forward_cuda``.

Releases before 0.1.6 and from 0.2.4 (its attention, block and model files change again) are refused rather than
answered with another release's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AUTOAWQ_RELEASES", "NEWEST_AUTOAWQ", "AutoAwqRelease", "autoawq_release"]


@dataclass(frozen=True)
class AutoAwqRelease:
    """One AutoAWQ release's fused-inference behaviour (module docstring)."""

    release: str
    window_argument: str        # the from_quantized argument that sizes the cache window
    default_window: int | None  # None: the config's max_position_embeddings (0.1.x); else this many positions
    fused_mlp: bool             # QuantFusedMLP (0.1.x) rather than transformers' LlamaMLP with WQLinear_GEMM
    dequant_min_tokens: int     # WQLinear_GEMM dequantizes the weight when batch x tokens >= this; 0: never
    source: str
    # load_checkpoint_and_dispatch moves the whole transformers model, its buffers included, to the GPU before
    # fuse_layers (0.1.7+); 0.1.6 fuses after load_checkpoint_in_model and dispatches afterwards
    dispatch_before_fuse: bool = True


def _old(release: str, source: str) -> AutoAwqRelease:
    """A 0.1.x row: ``max_new_tokens`` (None: the config's positions), fused MLP, no dequantizing GEMM."""
    return AutoAwqRelease(release, "max_new_tokens", None, True, 0, source, dispatch_before_fuse=release != "0.1.6")


def _new(release: str) -> AutoAwqRelease:
    """A 0.2.0-0.2.3 row: ``max_seq_len=2048``, transformers' MLP, dequantizing GEMM from 1,024 tokens."""
    return AutoAwqRelease(release, "max_seq_len", 2048, False, 1024,
                          f"v{release} awq/models/auto.py from_quantized, awq/modules/linear/gemm.py")


AUTOAWQ_RELEASES: tuple[AutoAwqRelease, ...] = (
    _old("0.1.6", "v0.1.6 awq/models/base.py _load_config, awq/modules/fused/attn.py (roll inside the attention)"),
    _old("0.1.7", "v0.1.7 awq/models/base.py _load_config, awq/utils/fused_utils.py prepare_cache"),
    _old("0.1.8", "v0.1.8 awq/models/base.py _load_config, awq/utils/fused_utils.py prepare_cache"),
    _new("0.2.0"), _new("0.2.1"), _new("0.2.2"), _new("0.2.3"),
)
NEWEST_AUTOAWQ = AUTOAWQ_RELEASES[-1].release


def autoawq_release(text: str | None) -> AutoAwqRelease:
    """The row of release ``text`` ("0.2.3", "0.1.6"); None: the newest modelled.  A release not read raises
    ValueError naming the modelled ones.

    >>> autoawq_release("0.1.6").default_window is None, autoawq_release(None).release
    (True, '0.2.3')
    """
    if text is None:
        return AUTOAWQ_RELEASES[-1]
    want = ".".join(str(int(x)) for x in text.split("."))
    for row in AUTOAWQ_RELEASES:
        if row.release == want or (want.count(".") == 1 and row.release == want + ".0"):
            return row
    names = ", ".join(r.release for r in AUTOAWQ_RELEASES)
    raise ValueError(f"AutoAWQ {text} is not modelled (releases read: {names})")
