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

from collections.abc import Sequence
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
    adafactor_tensors: Sequence[tuple[int, int, int]] = (),
) -> OptimizerCost:
    """States and step temporaries for ``trainable`` parameters held on this GPU.

    ``small_tensor_params``: parameters in tensors below bitsandbytes' 8-bit threshold.
    ``adafactor_factored``: Adafactor's row+column state elements for the matrices, plus
    the full-size state of vectors (computed by the caller from the tensor shapes).
    ``adafactor_tensors``: (elements, rows, columns) of each parameter in step order
    (``adafactor_step_bytes``).
    """
    if optimizer == "none" or trainable == 0:
        return OptimizerCost(0, 0, 0)
    if optimizer == "adafactor":
        tensors = adafactor_tensors or ((largest_param, 0, 0),)
        return OptimizerCost(adafactor_factored * 4, 0, adafactor_step_bytes(tensors, param_bytes))
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


def adafactor_step_bytes(tensors: Sequence[tuple[int, int, int]], param_bytes: int) -> int:
    """Peak temporaries of ``transformers.optimization.Adafactor.step``, one parameter at a time.

    ``tensors``: (n elements, rows, columns) per parameter in step order (the Trainer's decay
    group, then the no-decay group); rows = columns = 0 for a vector (unfactored).  Per
    parameter, in ``step()`` (transformers 4.x/5.x, unchanged since the fairseq port):

    * ``grad = grad.float()`` and ``p_data_fp32 = p.float()`` for bf16/fp16 parameters: two fp32
      copies (4n each) alive for the whole iteration (none for fp32 parameters);
    * ``update = (grad**2) + eps``: the square and the sum (4n + 4n) while the previous
      parameter's ``update`` (4 n_prev) is still bound to the local name until this assignment;
    * factored: ``_approx_sq_grad`` builds ``r_factor`` (rows) and ``c_factor`` (columns) and
      their outer product (4n) while ``update`` (4n) is alive; unfactored: ``exp_avg_sq.rsqrt()``
      (4n) beside ``update``;
    * ``p_data_fp32.add_(-update)``: the negation (4n) beside ``update``.

    So parameter i peaks at 4 (copies n_i + 2 n_i + max(n_prev, rows_i + cols_i)) bytes, with
    copies = 2 for half parameters, 0 for fp32; the step's peak is the largest over parameters.

    Worked example, Llama-3.1-8B in bf16-true: the LM head (128,256 x 4,096 = 525,336,576
    elements) follows the last down projection (58,720,256): 4 x (2 + 2) x 525,336,576
    + 4 x 58,720,256 = 8,640,266,240 B (8.6 GB) above the states.
    """
    copies = 2 if param_bytes < 4 else 0
    best = prev = 0
    for n, rows, cols in tensors:
        best = max(best, 4 * ((copies + 2) * n + max(prev, rows + cols)))
        prev = n
    return best
