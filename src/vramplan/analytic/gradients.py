"""Gradients and fp32 master weights held by one GPU.

* A gradient has its parameter's dtype (``param.grad``): fp32 for autocast mixed
  precision, half for ``*-true`` and for DeepSpeed's half-precision module.
* Only trainable parameters get gradients: with PEFT, the adapters alone.
* DDP (``torch.nn.parallel.DistributedDataParallel``) with the default
  ``gradient_as_bucket_view=False`` keeps its own flat bucket copy of every gradient
  for all-reduce, doubling gradient memory (PyTorch DDP notes, "gradient_as_bucket_view").
* ZeRO-2/3 and FSDP full/grad-op sharding keep 1/dp of the gradients after each
  reduce-scatter (ZeRO paper, arXiv 1910.02054 section 5.2).
* Master weights: DeepSpeed keeps an fp32 copy of the (partition of the) parameters
  (4 B/param), divided by dp from ZeRO stage 1 on.
"""

from __future__ import annotations

from vramplan.units import ceil_div


def gradient_bytes(trainable: int, grad_bytes: int, shards: int) -> int:
    """``trainable`` parameters' gradients, split over ``shards`` GPUs (1: unsharded)."""
    return ceil_div(trainable, shards) * grad_bytes


def ddp_bucket_bytes(trainable: int, grad_bytes: int, dp: int) -> int:
    """DDP's flat all-reduce buckets: a second copy of all gradients when dp > 1."""
    return trainable * grad_bytes if dp > 1 else 0


def master_weight_bytes(trainable: int, shards: int, master_bytes: int = 4) -> int:
    return ceil_div(trainable, shards) * master_bytes


def tied_embedding_accumulation_bytes(vocab_on_rank: int, hidden: int, grad_bytes: int,
                                      head_grad_is_view: bool) -> int:
    """Extra gradient buffers when a tied embedding's two contributions are summed (end of backward).

    A tied parameter is used twice (LM head, input embedding), so its ``AccumulateGrad`` node
    has two incoming edges.  The head's contribution (V x h) arrives first and waits in the
    node's input buffer; the embedding's ``embedding_dense_backward`` produces the second
    (a fresh V x h tensor) after the first layer's backward, when every other gradient exists.
    ``InputBuffer::accumulate`` (torch/csrc/autograd/input_buffer.cpp) adds them
    *in place* (``old_var.add_(var)``) only when ``can_accumulate_inplace(old_var)``: the first
    contribution must own a dense storage alone.  Otherwise it adds *out of place*
    (``old_var + var``): a third buffer, alive together with both.  Then ``AccumulateGrad``
    (functions/accumulate_grad.h, ``accumulateGrad``) steals the sum as ``param.grad``
    (no copy), so one V x h buffer is the gradient and the others are extra:

    * the head multiplies the parameter itself (fp32, ``*-true``, DeepSpeed's half module):
      ``MmBackward`` hands its weight gradient through ``TBackward`` as a transposed view,
      whose storage is shared, so the sum is out of place: 2 extra buffers;
    * autocast casts the weight for the head: ``ToCopyBackward`` returns a fresh fp32
      tensor, summed in place: 1 extra buffer (the embedding's contribution).

    Under a ``TorchDispatchMode`` (the traced engine and ``vramplan measure`` run under one)
    ``at::isTensorSubclassLike`` is true for every tensor (ATen/TensorSubclassLikeUtils.h), which
    would make every sum out of place; the tracker makes the engine's in-place decision itself
    (trace/tracker.py), so the trace shows the same 1 or 2 extra buffers as a step without it.

    Worked example, GPT-2 (V = 50,257, h = 768) in fp32: 2 x 50,257 x 768 x 4 B
    = 308,779,008 B (294.5 MiB) above all gradients; under bf16-mixed 154,389,504 B.
    """
    return (2 if head_grad_is_view else 1) * vocab_on_rank * hidden * grad_bytes
