"""TRL's fused LM head: per-token log-probabilities without the logits (KTO at v1.16.0, DPO and GRPO from v1.15.0).

Read in TRL v1.16.0 (the PyPI wheel ``trl-1.16.0``; the v1.15.0 wheel has the same buffers): ``trl/trainer/utils.py``
``add_fused_lm_head._fused_forward`` and ``trl/kernels/chunked_logprob.py`` ``ChunkedLogProbFunction``.  A trainer
patches its model with ``add_fused_lm_head(model, outputs=...)`` and calls ``model(..., labels=labels,
fused_lm_head=True)``: the backbone runs, ``hidden_states[mask]`` gathers the N labelled positions (a copy; on CUDA,
the compact path), the kernel projects them in tiles of ``min(N, 4096) x 32768`` into one reused buffer (``mm_buf``)
and folds each tile into seven fp32 per-token statistics; the requested ``outputs`` are scattered back to the
batch's shape (``new_zeros(mask.shape).masked_scatter``).  Which trainer asks for which outputs:

* KTOTrainer (v1.16.0): ``log_probs``, ``entropy``, ``mean_logits``: 12 bytes per position;
* DPOTrainer (v1.15.0 on): ``log_probs``, ``entropy``, ``mean_logits`` (fp32) and ``is_top1`` (bool): 13 bytes;
* GRPOTrainer (v1.15.0 on): ``log_probs``, ``entropy``: 8 bytes.

Every one asks for the entropy, so the kernel saves it (``ctx.save_for_backward(hidden, weight, bias, targets,
log_z, entropy)``) beside the gathered hidden states, the int64 targets and ``log_z``.
"""

from __future__ import annotations

from vramplan.analytic.logits import KernelLossTensors

__all__ = ["FUSED_STATS", "FUSED_TOKEN_ROWS", "FUSED_VOCAB_COLUMNS", "fused_forward_bytes", "fused_loss_tensors",
           "fused_tiles"]

# trl/kernels/chunked_logprob.py TOKEN_CHUNK_SIZE: tokens per projection tile
FUSED_TOKEN_ROWS = 4096
# trl/trainer/utils.py _CHUNKED_LOGPROB_CHUNK_SIZE: vocabulary columns per tile (the tile buffer is this wide even
# when the vocabulary is narrower: torch.empty((min(N, TOKEN_CHUNK_SIZE), chunk_size)))
FUSED_VOCAB_COLUMNS = 32768
# ChunkedLogProbFunction.forward: running_max, sum_exp, x_sum_exp, sq_sum_exp, z_sum, max_before_target and
# target_logit, one fp32 value per token each (allocated whatever ``outputs`` asks for)
FUSED_STATS = 7


def fused_tiles(tokens: int, hidden: int, compute_bytes: int, hidden_bytes: int, weight_bytes: int) -> int:
    """One fused-head call's working buffers: the tile ``mm_buf`` (``min(N, 4096) x 32768`` in the compute dtype),
    one vocabulary chunk of the head cast to the compute dtype (``weight[start:end].to(compute_dtype)``, none when
    the head already is), and one token chunk of the hidden states cast likewise (none when they already are)."""
    rows = min(tokens, FUSED_TOKEN_ROWS)
    tile = rows * FUSED_VOCAB_COLUMNS * compute_bytes
    w_cast = FUSED_VOCAB_COLUMNS * hidden * compute_bytes if weight_bytes != compute_bytes else 0
    h_cast = rows * hidden * compute_bytes if hidden_bytes != compute_bytes else 0
    return tile + w_cast + h_cast


def fused_forward_bytes(tokens: int, hidden: int, hidden_bytes: int, compute_bytes: int, weight_bytes: int) -> int:
    """One fused-head forward's largest moment beyond the backbone's output: the gathered hidden states (N H x),
    the seven fp32 statistics (28 N) and the tiles (a no-grad forward: the reference's, GRPO's scoring)."""
    n = tokens
    return n * hidden * hidden_bytes + FUSED_STATS * 4 * n + fused_tiles(n, hidden, compute_bytes, hidden_bytes,
                                                                         weight_bytes)


def fused_loss_tensors(tokens: int, positions: int, output_bytes: int, vocab: int, hidden: int, hidden_bytes: int,
                       compute_bytes: int, weight_bytes: int, head_trainable: bool, reference: int = 0
                       ) -> KernelLossTensors:
    """The policy's fused head over ``tokens`` = N labelled positions, its outputs over ``positions`` (the batch's
    ``b (s - 1)``) at ``output_bytes`` each, and ``reference`` (the bytes of the reference's no-grad forwards after
    it, one at a time; 0: none inside the step), as (saved to the backward, forward extra, backward extra).

    * saved: the gathered hidden states (N H x), the targets (int64, 8 N), ``log_z`` and the entropy (fp32, 4 N
      each); the head's weight is the parameter (no copy);
    * forward extra: the larger of the policy's own kernel moment (the statistics and the tiles: its gathered
      hidden states are the saved ones) and its scattered outputs with the reference's forward beside them;
    * backward (``ChunkedLogProbFunction.backward``): ``grad_hidden`` fp32 (N H 4), ``grad_weight`` fp32 (V H 4, a
      trainable head only), the tiles again, and ``grad_hidden.to(hidden.dtype)`` (N H x when x is not fp32).
    """
    n, h, x = tokens, hidden, hidden_bytes
    tiles = fused_tiles(n, h, compute_bytes, x, weight_bytes)
    saved = n * h * x + (8 + 4 + 4) * n
    own = FUSED_STATS * 4 * n + tiles
    grad_weight = vocab * h * 4 if head_trainable else 0
    backward = n * h * 4 + grad_weight + tiles + (n * h * x if x != 4 else 0)
    return KernelLossTensors(saved=saved, forward_extra=max(own, output_bytes * positions + reference),
                             backward_extra=backward)
