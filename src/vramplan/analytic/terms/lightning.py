"""What a MiniMax lightning attention layer saves for its backward in training, tensor by tensor (bytes for one
micro-batch), where no autocast runs (``bf16-true``, ``fp16-true``, ``fp32``; spec/checks.py
``linear_mixer_analytic_problems`` refuses autocast, under which the block products mix fp32 decay factors with half
states and the matmuls save other casts).

Modelled: transformers 5.24's ``MiniMaxLightningAttention.forward`` (``models/minimax/modeling_minimax.py``, lines
177-273) without a cache (training runs ``use_cache=False``: the block-wise branch of lines 202-243, and the final
state, returned as the second output, is dropped by ``MiniMaxDecoderLayer.forward``, line 566, so the last block's
state update is reached by nothing the loss depends on and saves nothing).  No padding mask: an all-ones mask is
dropped by ``create_recurrent_attention_mask`` (masking_utils.py 5.24, lines 1516-1522), so
``apply_mask_to_padding_states`` multiplies nothing.  Autograd's saved tensors follow ``tools/autograd/
derivatives.yaml`` (mm and bmm save the input that the other's gradient needs; mul saves the operand the other's
gradient needs; silu its input, sigmoid and rsqrt their result, pow its input).

Notation: ``b`` sequences of ``s`` tokens, ``T = b s``; ``H`` heads of ``d`` (``D = H d``), hidden ``h``; block
``B`` (``block_size``), ``n = ceil(s / B)`` blocks, the last of ``L = s - (n - 1) B`` tokens, the first of
``F = min(B, s)``; ``c`` bytes of the compute dtype, fp32 4.

* ``qkv_proj``'s and ``output_gate``'s input (one tensor): ``T h c``; ``act_fn``'s (SiLU) input, ``qkv_proj``'s
  output: ``3 T D c``.
* Query, key and value are transposed split views of SiLU's output (``[b, H, s, d]`` with strides ``(s 3D, 3d, 3D,
  1)``).  ``torch.matmul`` of 4-D operands folds ``b`` and ``H`` into bmm's batch by ``reshape``, which copies unless
  the two fold into a view (``b = 1`` or ``H = 1``): with copies every block saves its query and key for the intra
  scores, its value for the intra output and, but in the last block, its value again for the next state (each
  matmul its own copy): ``b H d c (3 s + (n - 1) B)``; without copies the saved slices keep SiLU's output,
  ``3 T D c``, once.
* Per block: the decayed scores ``attn_weights_intra * diagonal_decay`` (``b H c Bi^2``, over blocks ``b H c ((n -
  1) B^2 + L^2)``); the query times ``query_decay`` for the inter output, saved once the incoming state needs
  grad, so from the second block (``b H d c (s - F)``); the incoming state, saved by the inter matmul in every
  block (the first block's is the zeros of line 204, saved all the same: ``n b H d^2 c``); the key times
  ``key_decay``, transposed, for the next state, but in the last block (``b H d c (n - 1) B``); ``block_decay``
  (``exp(-slope_rate * Bi)``, ``[H, 1, 1]``) saved by ``attn_weights_inter * block_decay`` where the state needs
  grad and the new state is read by a later block: blocks 2 to ``n - 1`` (``max(n - 2, 0) H c``).
* The decay factors themselves are buffers (saved, not counted: resident, analytic/ssm_state.py
  ``mixer_buffer_bytes``).
* ``norm`` (``MiniMaxRMSNorm`` over ``D``): its fp32 input (the concatenated blocks' reshaped copy, cast; in fp32 the
  copy itself), the inverse norms (``T D 4 + T 4``), the normalized product cast back (``T D c``); its output, saved by
  the gate's product (``T D c``); ``sigmoid(output_gate(...))`` (``T D c``); ``out_proj``'s input (``T D c``).

The sum equals the saved tensors of autograd's graph after a ``MiniMaxLightningAttention`` forward on the meta
device, storage by storage (tests/test_families_minimax.py ``test_lightning_saved_equals_the_autograd_graph``).  The
gradients the block loop's backward makes are not counted (as for the Mamba2 and Gated DeltaNet mixers: the report
says so).
"""

from __future__ import annotations

from vramplan.analytic.activations import SavedTensor
from vramplan.spec.model import MambaSpec
from vramplan.units import ceil_div

__all__ = ["lightning_saved_tensors"]

FP32 = 4


def lightning_saved_tensors(ms: MambaSpec, hidden: int, c: int, batch: int, seq: int) -> tuple[SavedTensor, ...]:
    """One lightning attention layer's saved tensors for ``batch`` sequences of ``seq`` tokens without autocast
    (module docstring), in bytes; ``c``: bytes of the compute dtype."""
    t, heads, d, blk = batch * seq, ms.n_heads, ms.head_dim, ms.chunk_size
    width = heads * d
    n = ceil_div(seq, blk)
    last, first = seq - (n - 1) * blk, min(blk, seq)
    rows = heads * batch * c  # one head row of every sequence, in the compute dtype
    # matmul folds batch and heads by reshape: a view only where one of them is 1, else a copy per operand and matmul
    views = batch == 1 or heads == 1
    qkv = ("lightning.qkv_views", 3 * t * width * c) if views else (
        "lightning.block_copies", rows * d * (3 * seq + (n - 1) * blk))
    out = [
        ("lightning.in_proj_input", t * hidden * c),
        ("lightning.act_input", 3 * t * width * c),
        qkv,
        ("lightning.block_scores", rows * ((n - 1) * blk * blk + last * last)),
        ("lightning.decayed_query", rows * d * (seq - first)),
        ("lightning.decayed_key", rows * d * (n - 1) * blk),
        ("lightning.states", n * rows * d * d),
        ("lightning.block_decay", max(n - 2, 0) * heads * c),
        ("norm.fp32", t * width * FP32 + t * FP32),
        ("norm.normalized", t * width * c),
        ("norm.output", t * width * c),
        ("gate.sigmoid", t * width * c),
        ("lightning.out_proj_input", t * width * c),
    ]
    return tuple(SavedTensor(name, nbytes) for name, nbytes in out if nbytes)
