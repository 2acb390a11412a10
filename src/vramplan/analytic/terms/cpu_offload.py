"""torchao's CPU-offload optimizer (``train.torchao_cpu_offload``): the optimizer's states on the host, the step
on the CPU, and, with ``optimizer+gradients``, each GPU gradient freed once copied to the host.

torchao v0.18.0 ``torchao/optim/cpu_offload.py`` ``CPUOffloadOptimizer.__init__``: for each trainable tensor of
at least ``minimal_size = 4096`` elements, ``p_host = torch.empty_like(p_device, device="cpu", pin_memory=True)``
and ``p_host.grad = torch.empty_like(p_host, pin_memory=True)`` (pinned, so PyTorch's CachingHostAllocator
rounds each up to a power of two, ``c10::llvm::PowerOf2Ceil``), a post-accumulate-grad hook that copies the
gradient to ``p_host.grad`` on a side stream (and, with ``offload_gradients``, ``p_device.grad = None`` after
``record_stream``), and one ``torch.optim.AdamW(fused=True)`` on ``p_host``, whose states (``exp_avg``,
``exp_avg_sq``: ``zeros_like`` of ``p_host``, pageable) are host memory.  Smaller tensors stay with an on-device
AdamW (``d_opt``, fused: no step temporary).  ``step()`` runs the CPU steps and copies each ``p_host`` back
into ``p_device`` in place: no GPU allocation.

Worked example (Llama-2-7B, bf16-true, one GPU): its smallest tensors, the norm weights, have 4096 elements, not
fewer, so every tensor is offloaded: states on the host 2 x 2 x 6,738,415,616 = 26,953,662,464 B, plus each
tensor's pinned copy and pinned gradient rounded up to a power of two (an MLP matrix: 2 x 45,088,768 =
90,177,536 B -> 134,217,728 B), 17,717,272,576 B each (tests/test_torchao_cpu_offload.py).
"""

from __future__ import annotations

from vramplan.analytic.logits import next_power_of_2
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.timeline import END, mlp
from vramplan.facts.optimizers import optimizer_facts

__all__ = ["MINIMAL_SIZE", "offloaded_tensors", "optimizer_states", "small_gradients"]

MINIMAL_SIZE = 4096  # CPUOffloadOptimizer(minimal_size=4096): smaller tensors stay on the GPU


def offloaded_tensors(c: StepContext) -> tuple[list[int], int]:
    """(elements of each tensor offloaded, elements of the tensors kept on the GPU): full fine-tuning on one GPU
    (spec/load.py ``torchao_offload_problems``), every parameter trainable."""
    big: list[int] = []
    small = 0
    for p in c.m.params:
        if p.numel < MINIMAL_SIZE:
            small += p.total
        else:
            big += [p.numel] * p.count
    return big, small


def optimizer_states(c: StepContext) -> list[Term]:
    """The small tensors' states on the GPU; the states, pinned parameter copies and pinned gradients on the host."""
    big, small = offloaded_tensors(c)
    name = c.s.train.optimizer
    f = optimizer_facts(name)
    pb = c.pol.param_bytes
    host_states = sum(st.bytes(sum(big), pb) for st in f.states)
    pinned = sum(next_power_of_2(n * pb) for n in big)
    return [resident(K.OPTIMIZER_STATES, sum(st.bytes(small, pb) for st in f.states), "optimizer.states",
                     optimizer=name),
            resident(K.OPTIMIZER_STATES, host_states, "optimizer.states.offloaded", where="host", optimizer=name),
            resident(K.PARAMETERS, pinned, "parameters.pinned_host", where="host"),
            resident(K.GRADIENTS, pinned, "gradients.pinned_host", where="host")]


def small_gradients(c: StepContext) -> list[Term]:
    """With ``optimizer+gradients``: the gradients of the tensors kept on the GPU (no hook frees them), from the
    last layer's backward (the head's, first) to the step's ``zero_grad``."""
    if c.s.train.torchao_cpu_offload != "optimizer+gradients":
        return []
    _, small = offloaded_tensors(c)
    return [Term(K.GRADIENTS, small * c.pol.grad_bytes, mlp(len(c.layer_specs) - 1), END, "gradients.small")]
