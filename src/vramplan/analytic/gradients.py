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
