"""Collective communication time: ring algorithms over the slowest link of a group.

NCCL's ring all-reduce moves 2 (n-1)/n of the buffer through every GPU's link, all-gather and
reduce-scatter (n-1)/n of the full (unsharded) buffer (NCCL tests, doc/PERFORMANCE.md: "bus
bandwidth" = algorithm bandwidth x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather and
reduce-scatter).  Time = a fixed per-collective cost + bytes through the link / link bandwidth.

Link bandwidth: inside a node the GPU catalog's NVLink (or PCIe) figure, which is the
bidirectional total, so half of it per direction; a group that spans nodes runs at the
per-GPU network bandwidth (an assumption, see ``assumptions.py``).

Worked example: all-reduce of 13.5 GB of bf16 gradients (Llama-2-7B) over 8 A100s
(NVLink3 600 GB/s -> 300 GB/s per direction): 2 * 7/8 * 13.5e9 / 300e9 = 78.75 ms.
"""

from __future__ import annotations

from vramplan.plan.steptime.assumptions import PerfAssumptions
from vramplan.spec.gpu import GpuSpec

__all__ = ["all_gather_seconds", "all_reduce_seconds", "link_bytes_per_s", "p2p_seconds", "reduce_scatter_seconds"]


def link_bytes_per_s(gpu: GpuSpec, group_spans_nodes: bool, a: PerfAssumptions) -> float:
    """One-direction bandwidth of the slowest link a group's ring crosses."""
    if group_spans_nodes:
        return a.inter_node_bytes_per_s
    return gpu.interconnect_bytes_per_s / 2 if gpu.interconnect_bytes_per_s else a.inter_node_bytes_per_s


def all_reduce_seconds(nbytes: float, ranks: int, bw: float, a: PerfAssumptions) -> float:
    """Ring all-reduce of ``nbytes`` on every rank: 2 (n-1)/n * bytes / bw (+ fixed cost).

    >>> round(all_reduce_seconds(13.5e9, 8, 300e9, PerfAssumptions(collective_latency_s=0)), 5)
    0.07875
    """
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return a.collective_latency_s + 2 * (ranks - 1) / ranks * nbytes / bw


def all_gather_seconds(nbytes: float, ranks: int, bw: float, a: PerfAssumptions) -> float:
    """Ring all-gather producing ``nbytes`` (the full buffer) on every rank: (n-1)/n * bytes / bw."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    return a.collective_latency_s + (ranks - 1) / ranks * nbytes / bw


def reduce_scatter_seconds(nbytes: float, ranks: int, bw: float, a: PerfAssumptions) -> float:
    """Ring reduce-scatter of an ``nbytes`` buffer (each rank keeps 1/n): (n-1)/n * bytes / bw."""
    return all_gather_seconds(nbytes, ranks, bw, a)


def p2p_seconds(nbytes: float, bw: float, a: PerfAssumptions) -> float:
    """One point-to-point send (pipeline activations or their gradients)."""
    if nbytes <= 0:
        return 0.0
    return a.collective_latency_s + nbytes / bw
