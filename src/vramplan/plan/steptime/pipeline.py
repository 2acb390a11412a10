"""Pipeline parallelism: the bubble.

With p stages and m micro-batches per step, 1F1B (and GPipe) run m + p - 1 micro-batch slots on
each stage; p - 1 of them are idle ramp-up and drain, a bubble fraction of (p-1)/m of the ideal
time (Narayanan et al., arXiv 2104.04473, sec. 2.2.1).  Each boundary also sends the micro-batch's
activations forward and their gradients back: tokens x hidden x compute bytes each way.

Interleaved 1F1B with v model chunks per rank (sec. 2.2.2) shrinks the bubble to (p-1)/v slots
(each chunk's forward and backward take 1/v of a micro-batch slot) and multiplies the boundary
sends by v (every chunk boundary on the rank sends and receives).  GPipe's bubble equals 1F1B's
(sec. 2.2.1).  The schedule's row (facts/pipeline_schedules.py) says whether it has chunks.

The zero-bubble schedules (torch's ScheduleInterleavedZeroBubble (ZB1P), ScheduleZBVZeroBubble (ZB-V),
ScheduleDualPipeV) split each backward into an input-gradient pass I and a weight-gradient pass W that only
its own I precedes, so W passes fill the slots 1F1B leaves idle (arXiv 2401.10241 sec. 2).  Their step is
timed by running each rank's actions in torch's order (``facts.pipeline_schedules.rank_actions``) against the
pipeline's dependencies (``split_schedule_makespan``): a chunk's F waits for the previous stage's F of the same
micro-batch, its I (or full B) for the next stage's I of it (the last stage for its own F), its W for its own I.
The durations are the slowest stage's forward, input-gradient and weight-gradient times, a chunk's share 1/v
of each (point-to-point time between stages is not in the walk).  With equal F, I and W the walk gives
(p - 1) / (3 v) slots for all three (a third of interleaved 1F1B's: the first forward's ramp through p - 1
ranks, whose idle the W passes cannot fill), the ZB1P figure of the paper's table; with frozen weights (LoRA)
W is nearly empty and the bubble returns towards (p - 1) / v.

Worked example: p = 4, m = 8, 1.0 s per micro-batch slot -> (8 + 3) * 1.0 = 11 s, of which
the bubble is 3 s; interleaved with v = 2: 8 + 3/2 = 9.5 s, the bubble 1.5 s.
"""

from __future__ import annotations

from functools import lru_cache

from vramplan.facts.pipeline_schedules import pipeline_schedule, rank_action_order

__all__ = ["pipeline_bubble_seconds", "pipeline_slots", "split_bubble_slots", "split_schedule_makespan",
           "stage_boundary_bytes"]


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


def _stage_of(style: str, pp: int, rank: int, chunk: int) -> int:
    """The pipeline stage of ``rank``'s local ``chunk`` (loop: r + k pp; V: r, then 2 pp - 1 - r)."""
    if style == "v":
        return rank if chunk == 0 else 2 * pp - 1 - rank
    return rank + chunk * pp


@lru_cache(maxsize=4096)
def split_schedule_makespan(schedule: str, pp: int, virtual: int, micro_batches: int,
                            f: float, i: float, w: float) -> float:
    """Wall time of one step's compute of a split-backward schedule (module docstring): every rank runs its actions
    in torch's order, each starting when the rank is free and its dependencies are done; F, I, W of a chunk take
    ``f``, ``i``, ``w`` and a full backward B takes ``i + w`` (its input gradient ready after ``i``).

    pp 2, v 2, 4 micro-batches of ZB1P with unit passes: each rank runs 4 micro-batches x 2 chunks x 3 passes = 24
    units, and rank 1 waits 1 for its first forward; the walk ends at 25 (one unit of bubble, 1 / (3 x 2) of a
    micro-batch slot):

    >>> split_schedule_makespan("interleaved-zero-bubble", 2, 2, 4, 1.0, 1.0, 1.0)
    25.0
    """
    row = pipeline_schedule(schedule)
    last = pp * virtual - 1
    acts = [rank_action_order(row, pp, r, virtual, micro_batches) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}  # (F | G (input gradient) | W, stage, micro-batch) -> finish time
    pos, free = [0] * pp, [0.0] * pp
    seen: list[dict[tuple[str, int], int]] = [{} for _ in range(pp)]
    left = sum(len(a) for a in acts)
    while left:
        moved = False
        for r in range(pp):
            while pos[r] < len(acts[r]):
                kind, k = acts[r][pos[r]]
                st = _stage_of(row.style, pp, r, k)
                key = ("I" if kind == "B" else kind, k)
                n = seen[r].get(key, 0)
                if kind == "F":
                    dep = ("F", st - 1, n) if st > 0 else None
                elif kind in ("I", "B"):
                    dep = ("G", st + 1, n) if st < last else ("F", st, n)
                else:
                    dep = ("G", st, n)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep]) if dep is not None else free[r]
                if kind == "F":
                    free[r] = done[("F", st, n)] = start + f
                elif kind == "W":
                    free[r] = start + w
                else:
                    done[("G", st, n)] = start + i
                    free[r] = start + i + (w if kind == "B" else 0.0)
                seen[r][key] = n + 1
                pos[r] += 1
                left -= 1
                moved = True
        if not moved:  # torch's orders are deadlock-free; a stuck walk is a defect of rank_actions
            raise RuntimeError(f"{schedule}: pipeline walk stuck at {pos} (pp {pp}, v {virtual}, m {micro_batches})")
    return max(free)


def split_bubble_slots(schedule: str, pp: int, virtual: int, micro_batches: int,
                       f: float, i: float, w: float) -> float:
    """Idle micro-batch slots of a split-backward schedule's step: the walk's wall time less a rank's busy time,
    in slots of one micro-batch through the whole stage (``v`` chunks of ``f + i + w``).  ``f``, ``i``, ``w`` are a
    stage's times for one micro-batch (any unit); the walk takes 1/v of each per chunk, rounded to 3 significant
    figures so that setups of near-equal shares share one walk.

    >>> round(split_bubble_slots("zbv-zero-bubble", 4, 2, 8, 1.0, 1.0, 1.0), 4)   # (4 - 1) / (3 x 2)
    0.5
    >>> round(split_bubble_slots("interleaved-zero-bubble", 4, 2, 8, 1.0, 2.0, 0.0), 4)  # no W: 1F1B's 3 / 2
    1.5
    """
    total = f + i + w
    if pp <= 1 or total <= 0:
        return 0.0
    fr, ir, wr = (float(f"{x / total:.3g}") for x in (f, i, w))
    span = split_schedule_makespan(schedule, pp, virtual, micro_batches, fr / virtual, ir / virtual, wr / virtual)
    return max(0.0, span - micro_batches * (fr + ir + wr)) / (fr + ir + wr)
