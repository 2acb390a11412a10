"""Offload: traffic over the host link and the optimizer step on the CPU.

ZeRO-Offload (Ren et al., arXiv 2101.06840, sec. 4): the fp32 master weights, the optimizer
states and the gradients live in host memory; every step the GPU sends its half-precision
gradients to the host and receives the updated half-precision parameters.  DeepSpeed reduces
(and, with offload, copies) gradients at every micro-step from ZeRO stage 2 on, and only at the
accumulation boundary in stage 1 (``DeepSpeedEngine.allreduce_gradients``: "ZeRO stage >= 2
communicates during non gradient accumulation boundaries as well").
Parameter offload (ZeRO-Infinity, arXiv 2104.07857; FSDP ``CPUOffloadPolicy``): the parameter
shard is copied to the GPU before each use -- the forward and the backward of every micro-step --
and FSDP keeps it in fp32 on the host (4 B per use), DeepSpeed in the half dtype (2 B).

The CPU optimizer is memory-bound on host DRAM: DeepSpeed's CPU Adam reads the fp32 master,
gradient and two moments (16 B), writes master and moments (12 B) and the half copy (2 B):
30 B per parameter.  Worked example: Llama-3-70B on 8 GPUs of one node, 8.8e9 parameters per
GPU, host DRAM 200 GB/s shared by 8 GPUs -> 8.8e9 * 30 / 25e9 = 10.6 s per step.
"""

from __future__ import annotations

__all__ = ["CPU_ADAM_BYTES_PER_PARAM", "cpu_optimizer_seconds", "host_link_seconds"]

CPU_ADAM_BYTES_PER_PARAM = 4 * 4 + 3 * 4 + 2


def host_link_seconds(nbytes: float, host_link_bytes_per_s: float) -> float:
    """Copy time over the GPU's host link (PCIe/NVLink-C2C figure per direction, GPU catalog)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / host_link_bytes_per_s


def cpu_optimizer_seconds(params_on_host: float, gpus_sharing_host: int, host_memory_bytes_per_s: float) -> float:
    """CPU Adam over one GPU's parameter partition, with the node's DRAM bandwidth shared.

    >>> round(cpu_optimizer_seconds(8.8e9, 8, 200e9), 2)
    10.56
    """
    if params_on_host <= 0:
        return 0.0
    per_gpu_bw = host_memory_bytes_per_s / max(1, gpus_sharing_host)
    return params_on_host * CPU_ADAM_BYTES_PER_PARAM / per_gpu_bw
