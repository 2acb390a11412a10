"""Optimizer states and the optimizer step's temporaries, per trainable parameter.

States (bytes per trainable parameter, ``p`` = the parameter's own bytes, since
torch optimizers allocate state ``zeros_like(param)``):

=====================  ==================================================  =========================
optimizer              state                                               source
=====================  ==================================================  =========================
adamw, adamw-fused     exp_avg + exp_avg_sq: 2p                            torch.optim.AdamW
paged-adamw            2p, in CUDA managed memory (not torch's allocator)  bitsandbytes PagedAdamW
adamw-8bit             2 x uint8 + one fp32 absmax per 256: 2 + 8/256;     bitsandbytes AdamW8bit,
                       tensors under 4096 elements keep fp32 states (8 B)  arXiv 2110.02861 sec. 2
paged-adamw-8bit       as adamw-8bit, in managed memory                    bitsandbytes
adafactor              row + column second moments for matrices            transformers Adafactor,
                       (n + m elements), full for vectors; no momentum      arXiv 1804.04235
sgd                    none                                                torch.optim.SGD
sgd-momentum           momentum_buffer: p                                  torch.optim.SGD
lion                   exp_avg: p                                          arXiv 2302.06675
=====================  ==================================================  =========================

Step temporaries: torch's AdamW on CUDA defaults to the ``foreach`` implementation
(``_default_to_fused_or_foreach``), whose ``_multi_tensor_adamw`` allocates
``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``: one state-dtype tensor per
parameter of the group, alive together.  The Trainer's largest group is the
weight-decay group.  ``fused=True`` updates in place (no temporary).
"""

from __future__ import annotations

from dataclasses import dataclass

BNB_BLOCK = 256  # bitsandbytes blockwise 8-bit optimizer block size
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit states for smaller tensors


@dataclass(frozen=True)
class OptimizerCost:
    state_bytes: int  # inside torch's caching allocator
    managed_bytes: int  # CUDA managed memory (paged optimizers)
    step_temporary_bytes: int


def state_bytes_per_param(optimizer: str, param_bytes: int) -> float:
    """Average state bytes per trainable parameter (large tensors)."""
    if optimizer in ("adamw", "adamw-fused", "paged-adamw"):
        return 2 * param_bytes
    if optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        return 2 + 2 * 4 / BNB_BLOCK
    if optimizer in ("sgd-momentum", "lion"):
        return param_bytes
    return 0


def optimizer_cost(
    optimizer: str,
    trainable: int,
    decay_group: int,
    param_bytes: int,
    small_tensor_params: int = 0,
    adafactor_factored: int = 0,
    largest_param: int = 0,
) -> OptimizerCost:
    """States and step temporaries for ``trainable`` parameters held on this GPU.

    ``small_tensor_params``: parameters in tensors below bitsandbytes' 8-bit threshold.
    ``adafactor_factored``: Adafactor's row+column state elements for the matrices, plus
    the full-size state of vectors (computed by the caller from the tensor shapes).
    """
    if optimizer == "none" or trainable == 0:
        return OptimizerCost(0, 0, 0)
    if optimizer == "adafactor":
        # transformers.optimization.Adafactor computes in fp32: ``update = grad**2 + eps`` and the
        # factored estimate are two fp32 tensors of the largest parameter's size per step.
        return OptimizerCost(adafactor_factored * 4, 0, 2 * 4 * largest_param)
    if optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        big = trainable - small_tensor_params
        states = 2 * big + 2 * 4 * -(-big // BNB_BLOCK) + 8 * small_tensor_params
        if optimizer.startswith("paged"):
            return OptimizerCost(0, states, 0)
        return OptimizerCost(states, 0, 0)
    per = int(state_bytes_per_param(optimizer, param_bytes))
    states = per * trainable
    if optimizer == "paged-adamw":
        return OptimizerCost(0, states, 0)
    temp = 0
    if optimizer == "adamw":
        temp = param_bytes * decay_group  # foreach sqrt of exp_avg_sq, state dtype == param dtype
    elif optimizer == "lion":
        temp = 2 * param_bytes * largest_param  # per-tensor update = exp_avg.clone()...sign_()
    return OptimizerCost(states, 0, temp)
