"""What a Qwen3-Next Gated DeltaNet layer saves for its backward in training, tensor by tensor (bytes for one
micro-batch), where no autocast runs (``bf16-true``, ``fp16-true``, ``fp32``; spec/checks.py refuses autocast, whose
bmm casts make other copies).

Modelled: transformers 5.24's torch path (``Qwen3NextGatedDeltaNet.forward`` in ``models/qwen3_next/
modeling_qwen3_next.py`` without a cache: ``causal_conv1d_fn`` and ``torch_chunk_gated_delta_rule``), which runs
without the ``fla`` and ``causal-conv1d`` packages and ``use_kernels=True``.  Autograd's saved tensors follow
``tools/autograd/derivatives.yaml`` (mm and bmm save their inputs; mul saves both operands that need it; exp and
sigmoid their result; silu and softplus their input; masked_fill its mask; ``linalg_solve_triangular`` the matrix and
its result).  Notation: ``b`` sequences of ``s`` tokens, ``T = b s``; ``nk`` key heads and ``nv`` value heads of ``dk``
and ``dv`` (``K = nk dk``, ``V = nv dv``, ``C = 2 K + V``); chunk ``l`` (64), ``P = ceil(s / l) l`` per sequence,
``nc = P / l``; ``B = b nv`` (the rule's batch of heads); ``k`` taps; ``c`` bytes of the compute dtype, fp32 4.

* ``in_proj_qkvz``'s and ``in_proj_ba``'s input (one tensor): ``T h c``;
* the convolution's input (the concatenated q, k, v) ``T C c`` and its padded output, which SiLU saves through the
  slice: ``b (s + k - 1) C c``;
* ``beta = b.sigmoid()`` (``T nv c``); ``softplus(a.float() + dt_bias)``'s input and output (``2 T nv 4``);
  ``A_log.float().exp()`` and its negation (``2 nv 4``);
* in the rule, fp32: the query and key before ``l2norm`` and their inverse norms (``2 T nv (dk + 1)``; in fp32 compute
  with as many value heads as key heads ``.to(float32)`` returns views of the activated convolution, ``T C`` then in
  place of ``2 T nv dk``); the padded query and key, ``k_beta``, ``k_cumdecay`` and the decayed query and key
  (``6 B P dk``); the padded value, ``new_values`` and each chunk's ``v_new`` (``3 B P dv``); the two ``@ key^T``
  products, the pairwise decays, the UT system and the intra-chunk attention (``5 B P l``); the three ``exp`` of the
  cumulative decay and the padded beta (``4 B P``); each chunk's incoming state (``B nc dk dv``); ``chunk_decay``
  (``B nc``); the mask (``l^2`` bytes) and the scale, a 0-d double (8 B).  The last chunk's state update feeds only
  the final state, which is discarded without a cache, so its records are freed with it; the first chunk's incoming
  state is a zero tensor without grad, so its reads save only the state: with one chunk the decayed query and key, the
  key's decay and ``chunk_decay`` are not saved (``4 B P dk``, ``3 B P``, no ``B nc``);
* ``Qwen3NextRMSNormGated``: its fp32 input, the gate's fp32 copy (SiLU's input) and SiLU's output (``3 T V 4``; where
  value heads equal key heads and the compute dtype is fp32, ``gate.to(float32)`` is ``z`` itself, a view of
  ``in_proj_qkvz``'s output, ``T (2 K + 2 V) 4``, in place of the copy), the inverse norms (``T nv 4``), the normalized
  and weighted tensors in the compute dtype (``2 T V c``);
* ``out_proj``'s input: ``T V c``.

The sum equals the saved tensors of autograd's graph after a ``Qwen3NextGatedDeltaNet`` forward on the meta device,
storage by storage (tests/test_families_qwen3_next.py).  The gradients the rule's backward makes are not counted
(as for the Mamba2 mixers: the report says so).
"""

from __future__ import annotations

from vramplan.analytic.activations import SavedTensor
from vramplan.spec.model import MambaSpec
from vramplan.units import ceil_div

__all__ = ["gated_deltanet_saved_tensors"]

FP32 = 4


def gated_deltanet_saved_tensors(ms: MambaSpec, hidden: int, c: int, batch: int, seq: int) -> tuple[SavedTensor, ...]:
    """One Gated DeltaNet layer's saved tensors for ``batch`` sequences of ``seq`` tokens without autocast (module
    docstring), in bytes; ``c``: bytes of the compute dtype."""
    t = batch * seq
    nv, nk, dk, dv, chunk = ms.n_heads, ms.key_heads, ms.state_size, ms.head_dim, ms.chunk_size
    key_dim, value_dim, conv = nk * dk, nv * dv, ms.conv_dim
    padded = ceil_div(seq, chunk) * chunk
    heads, nc = batch * nv, padded // chunk
    gate = t * (2 * key_dim + 2 * value_dim) * FP32 if c == FP32 and nv == nk else t * value_dim * FP32
    # fp32 compute without repeated heads: the rule's .to(float32) query and key are views of the activated convolution
    l2norm = t * conv * FP32 if c == FP32 and nv == nk else 2 * t * nv * dk * FP32
    # the last chunk's state update feeds only the discarded final state: with one chunk the decayed query and key,
    # the key's decay and chunk_decay are saved by nothing the output reaches
    several = nc > 1
    rows = [
        ("gdn.in_proj_input", t * hidden * c),
        ("gdn.conv_input", t * conv * c),
        ("gdn.conv_output", batch * (seq + ms.conv_kernel - 1) * conv * c),
        ("gdn.beta", t * nv * c),
        ("gdn.softplus", 2 * t * nv * FP32),
        ("gdn.A", 2 * nv * FP32),
        ("rule.l2norm", l2norm + 2 * t * nv * FP32),
        ("rule.key_dim", (6 if several else 4) * heads * padded * dk * FP32),
        ("rule.value_dim", 3 * heads * padded * dv * FP32),
        ("rule.chunk_square", 5 * heads * padded * chunk * FP32),
        ("rule.decays", (4 if several else 3) * heads * padded * FP32),
        ("rule.states", heads * nc * (dk * dv + (1 if several else 0)) * FP32),
        ("rule.mask_scale", chunk * chunk + 8),
        ("norm.fp32", 2 * t * value_dim * FP32 + gate + t * nv * FP32),
        ("norm.weighted", 2 * t * value_dim * c),
        ("gdn.out_proj_input", t * value_dim * c),
    ]
    return tuple(SavedTensor(name, nbytes) for name, nbytes in rows)
