"""Pipeline parallelism: the bubble.

With p stages and m micro-batches per step, 1F1B (and GPipe) run m + p - 1 micro-batch slots on
each stage; p - 1 of them are idle ramp-up and drain, a bubble fraction of (p-1)/m of the ideal
time (Narayanan et al., arXiv 2104.04473, sec. 2.2.1).  Each boundary also sends the micro-batch's
activations forward and their gradients back: tokens x hidden x compute bytes each way.

Interleaved 1F1B with v model chunks per rank (sec. 2.2.2) shrinks the bubble to (p-1)/v slots
(each chunk's forward and backward take 1/v of a micro-batch slot) and multiplies the boundary
sends by v (every chunk boundary on the rank sends and receives).  GPipe's bubble equals 1F1B's
(sec. 2.2.1).  The schedule's row (facts/pipeline_schedules.py) says whether it has chunks.  The
zero-bubble schedules (ZB1P, ZB-V, DualPipeV) are timed with the same (p-1)/v bubble: their own
(the W passes filling idle slots, DualPipeV's overlapped forward and backward) is not modelled.

Worked example: p = 4, m = 8, 1.0 s per micro-batch slot -> (8 + 3) * 1.0 = 11 s, of which
the bubble is 3 s; interleaved with v = 2: 8 + 3/2 = 9.5 s, the bubble 1.5 s.
"""

from __future__ import annotations

__all__ = ["pipeline_bubble_seconds", "pipeline_slots", "stage_boundary_bytes"]


def pipeline_slots(micro_batches: int, stages: int, virtual: int = 1) -> float:
    """Micro-batch slots in a step, bubble included (``virtual``: model chunks per rank).

    >>> pipeline_slots(8, 4), pipeline_slots(8, 1), pipeline_slots(8, 4, 2)
    (11.0, 8.0, 9.5)
    """
    return micro_batches + (stages - 1) / virtual


def pipeline_bubble_seconds(slot_seconds: float, stages: int, virtual: int = 1) -> float:
    """Idle time of a 1F1B or GPipe step: (p - 1) slots; interleaved: (p - 1) / v slots."""
    return (stages - 1) * slot_seconds / virtual


def stage_boundary_bytes(tokens: int, hidden: int, compute_bytes: int, tp: int, sequence_parallel: bool) -> float:
    """Bytes one stage boundary sends per micro-batch in one direction (Megatron scatters it over TP ranks)."""
    per = tokens * hidden * compute_bytes
    return per / tp if sequence_parallel and tp > 1 else float(per)
