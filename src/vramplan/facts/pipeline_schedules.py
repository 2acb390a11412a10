"""Pipeline-parallel schedules as data: one frozen record per schedule (``parallel.pp_schedule``).

Each row names the schedule's class in ``torch.distributed.pipelining`` (torch 2.13
``torch/distributed/pipelining/schedules.py``), the name torchtitan's ``[parallelism]
pipeline_parallel_schedule`` passes to that module's ``get_schedule_class`` (case-insensitive), how many
model chunks ("virtual stages") a rank holds, how its chunks are laid out over the ranks, and the rule
for the micro-batches whose saved activations a rank holds at its peak.  The analytic engine
(``analytic/terms/context.py``), the step-time model (``plan/steptime/pipeline.py``), the torchtitan
exporter and the CLI's help read these rows.

In-flight rules, for ``pp`` ranks, ``m`` micro-batches per step (``train.grad_accum_steps``), rank ``r``
and ``v`` chunks per rank, counted in chunk-micro-batches (one micro-batch's saved tensors of one chunk,
``layers / (pp x v)`` layers):

* ``1f1b`` (``Schedule1F1B``; Megatron's non-interleaved schedule, arXiv 2104.04473 sec. 2.2): rank ``r``
  runs ``min(m, pp - r)`` forwards before its first backward (``Schedule1F1B._step_microbatches``:
  ``warmup_chunks = min(n_microbatches, num_stages - stage_index)``), then one backward per forward:
  ``min(m, pp - r)`` in flight.  pp 4, m 8: 4, 3, 2, 1.
* ``gpipe`` (``ScheduleGPipe``, arXiv 1811.06965): every forward of the step, then every backward
  (``ScheduleGPipe._step_microbatches``): ``m`` in flight on every rank.
* ``interleaved-1f1b`` (``ScheduleInterleaved1F1B``, arXiv 2104.04473 sec. 2.2.2): ``rounds = max(1, m //
  pp)``, ``per_round = m // rounds`` (torch raises unless ``m % rounds == 0``); the warmup forwards are
  ``_get_warmup_ops(multiply_factor=2)`` = ``min((v - 1) x per_round + 2 x (pp - 1 - r), m x v)``; in the
  steady phase ``_get_1f1b_rank_ops`` appends each forward before its backward, so the peak is one more
  (``warmup + 1``), or ``m x v`` when the warmup already runs every forward.  pp 4, v 2, m 8, rank 0:
  rounds 2, per_round 4, warmup 4 + 6 = 10, peak 11 chunk-micro-batches = 5.5 micro-batches of the
  rank's layers: Megatron's pp x (1 + (pp - 1) / (pp x v)) = 4 x 11/8 = 5.5 (the same where
  ``per_round = pp``; torch's count is used where they differ, e.g. m not a multiple of pp).

The zero-bubble schedules (``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``,
``ScheduleDualPipeV``) split each backward into an input-gradient pass (B) and a weight-gradient pass
(W).  torch's ``stage_backward_input`` (``torch/distributed/pipelining/_backward.py``) runs B with
``retain_graph=True``, so every saved tensor of the chunk stays until its W pass, and also keeps, per
parameter group that ``get_param_groups`` finds in the autograd graph, the gradients flowing into that
group's intermediate nodes (``param_group["grads"]``) until W; ``PipelineStage.backward_one_chunk`` (stage.py)
also keeps the chunk's received output gradients in ``backward_state`` until then, and on stage 0 skips B and runs
the whole backward at W time.  Which nodes those are depends on the
graph autograd records for the model (the reverse-graph closure of ``get_param_groups``), not on the
schedule's arithmetic, so these rows carry no in-flight rule and the engine refuses them (``refusal``).
Their warmups, for the record: ``ScheduleInterleavedZeroBubble`` runs ``_get_warmup_ops(multiply_factor=1)`` =
``min((v - 1) x per_round + (pp - 1 - r), m x v)`` forwards, then B passes whose W passes trail by ``r``
micro-batches (``num_1f1b_microbatches = rank``); ``ScheduleZBVZeroBubble`` (v = 2, chunks r and 2 pp - 1 - r)
runs ``2 (pp - r) - 1`` chunk-0 forwards, ``r`` (chunk-1, chunk-0) forward pairs, then ``pp - r`` chunk-1
F, B, W triples before its steady phase; in the cooldown the W passes of ``r`` micro-batches of each chunk
wait behind their B passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from vramplan.facts import row_named

__all__ = ["PIPELINE_SCHEDULES", "PipelineSchedule", "in_flight_chunks", "interleaved_rounds", "peak_saved_bytes",
           "pipeline_schedule", "pipeline_schedule_names"]

InFlightRule = Literal["1f1b", "all", "interleaved"]


@dataclass(frozen=True)
class PipelineSchedule:
    """One pipeline schedule.

    ``multi_stage``: a ``PipelineScheduleMulti`` (several chunks per rank, ``parallel.pp_virtual_stages``);
    ``min_virtual``/``max_virtual``: the chunks per rank it takes (None: no upper bound); ``style``: torchtitan's
    ``stage_ids_this_rank`` layout (``loop``: rank r holds chunks r, r + pp, ...; ``v``: rank r holds r and
    2 pp - 1 - r); ``in_flight``: the rule of the module docstring, None where the memory is not modelled
    (``refusal`` says why)."""

    name: str
    torch_class: str
    torchtitan: str
    multi_stage: bool
    min_virtual: int
    max_virtual: int | None
    style: Literal["loop", "v"]
    in_flight: InFlightRule | None
    source: str
    refusal: str = ""


_ZB_REFUSAL = ("its B pass (torch stage_backward_input, retain_graph=True) keeps each chunk's saved tensors and "
               "the gradients at the intermediates get_param_groups finds in the autograd graph until the W pass; "
               "those intermediates depend on the recorded graph, so the held bytes are not modelled")

PIPELINE_SCHEDULES: tuple[PipelineSchedule, ...] = (
    PipelineSchedule("1f1b", "Schedule1F1B", "1F1B", False, 1, 1, "loop", "1f1b",
                     "arXiv 2104.04473 sec. 2.2; torch 2.13 Schedule1F1B warmup_chunks = min(m, pp - stage)"),
    PipelineSchedule("gpipe", "ScheduleGPipe", "GPipe", False, 1, 1, "loop", "all",
                     "arXiv 1811.06965; torch 2.13 ScheduleGPipe: all forwards, then all backwards"),
    PipelineSchedule("interleaved-1f1b", "ScheduleInterleaved1F1B", "Interleaved1F1B", True, 2, None, "loop",
                     "interleaved",
                     "arXiv 2104.04473 sec. 2.2.2; torch 2.13 ScheduleInterleaved1F1B, _get_warmup_ops "
                     "(multiply_factor=2) and _get_1f1b_rank_ops"),
    PipelineSchedule("interleaved-zero-bubble", "ScheduleInterleavedZeroBubble", "InterleavedZeroBubble", True, 2,
                     None, "loop", None, "arXiv 2401.10241 (ZB1P); torch 2.13 ScheduleInterleavedZeroBubble",
                     _ZB_REFUSAL),
    PipelineSchedule("zbv-zero-bubble", "ScheduleZBVZeroBubble", "ZBVZeroBubble", True, 2, 2, "v", None,
                     "arXiv 2401.10241 sec. 6; torch 2.13 ScheduleZBVZeroBubble", _ZB_REFUSAL),
    PipelineSchedule("dualpipev", "ScheduleDualPipeV", "DualPipeV", True, 2, 2, "v", None,
                     "arXiv 2412.19437 (DualPipe); torch 2.13 ScheduleDualPipeV", _ZB_REFUSAL),
)


def pipeline_schedule_names() -> tuple[str, ...]:
    """The values of ``parallel.pp_schedule``."""
    return tuple(r.name for r in PIPELINE_SCHEDULES)


def pipeline_schedule(name: str) -> PipelineSchedule:
    """The row called ``name`` (KeyError naming the known rows otherwise)."""
    return row_named(PIPELINE_SCHEDULES, name, "pipeline schedule")


def interleaved_rounds(pp: int, m: int) -> tuple[int, int]:
    """(rounds, micro-batches per round) of torch's interleaved schedules: ``max(1, m // pp)`` rounds of
    ``m // rounds``; torch raises unless ``m`` is a multiple of the rounds (``ScheduleInterleaved1F1B.__init__``)."""
    rounds = max(1, m // pp)
    return rounds, m // rounds


def in_flight_chunks(row: PipelineSchedule, pp: int, rank: int, virtual: int, m: int) -> int:
    """Chunk-micro-batches whose saved tensors rank ``rank`` holds at its peak (module docstring).

    >>> one, gp, il = (pipeline_schedule(n) for n in ("1f1b", "gpipe", "interleaved-1f1b"))
    >>> [in_flight_chunks(one, 4, r, 1, 8) for r in range(4)], in_flight_chunks(gp, 4, 3, 1, 8)
    ([4, 3, 2, 1], 8)
    >>> [in_flight_chunks(il, 4, r, 2, 8) for r in range(4)]
    [11, 9, 7, 5]
    """
    if row.in_flight is None:
        raise ValueError(f"pipeline schedule {row.name}: {row.refusal}")
    if pp == 1:
        return virtual
    if row.in_flight == "1f1b":
        return min(m, pp - rank)
    if row.in_flight == "all":
        return m * virtual
    _, per_round = interleaved_rounds(pp, m)
    total = m * virtual
    warmup = min((virtual - 1) * per_round + 2 * (pp - 1 - rank), total)
    return warmup + 1 if warmup < total else total


def _interleaved_order(pp: int, rank: int, virtual: int, m: int) -> list[tuple[int, int]]:
    """Rank ``rank``'s compute actions under ``ScheduleInterleaved1F1B``: (+1 forward / -1 backward, local chunk),
    as torch 2.13's ``_get_1f1b_rank_ops`` orders them (``forward_stage_index``: chunk ``(op // per_round) % v``;
    ``backward_stage_index``: chunk ``v - 1 - ((op - warmup) // per_round) % v``), idle slots left out."""
    _, per_round = interleaved_rounds(pp, m)
    total = m * virtual
    warmup = min((virtual - 1) * per_round + 2 * (pp - 1 - rank), total)
    out: list[tuple[int, int]] = []
    for op in range(total + warmup):  # warmup forwards, total - warmup (F, B) pairs, warmup backwards
        if op < total:
            out.append((1, (op // per_round) % virtual))
        if op >= warmup:
            out.append((-1, virtual - 1 - ((op - warmup) // per_round) % virtual))
    return out


def peak_saved_bytes(row: PipelineSchedule, pp: int, rank: int, virtual: int, m: int,
                     chunk_bytes: Sequence[int]) -> int:
    """The most saved-activation bytes rank ``rank`` holds at once, ``chunk_bytes[k]`` being one micro-batch's
    saved bytes of its local chunk ``k``: 1F1B ``min(m, pp - r)`` micro-batches, GPipe ``m``; interleaved 1F1B
    walks torch's action order, adding a chunk's bytes at each forward and taking them off at its backward,
    so chunks of unequal layers count at their own size.  With equal chunks it is ``in_flight_chunks`` x a chunk.

    12 layers, pp 4, v 2, m 8, rank 0: chunks of 2 and 1 layers (1 byte a layer); warmup 10 forwards (chunk 0 for
    ops 0-3 and 8-9, chunk 1 for 4-7): 6 x 2 + 4 x 1 = 16; op 11's forward (chunk 0) after op 10's backward
    (chunk 1): 16 + 2 - 1 + 2 = 19, where the count of chunks (11) x the mean chunk (1.5) would say 16.5.

    >>> peak_saved_bytes(pipeline_schedule("interleaved-1f1b"), 4, 0, 2, 8, (2, 1))
    19
    """
    if row.in_flight is None:
        raise ValueError(f"pipeline schedule {row.name}: {row.refusal}")
    if pp == 1 or row.in_flight != "interleaved":
        return in_flight_chunks(row, pp, rank, virtual, m) * sum(chunk_bytes) // virtual
    alive = peak = 0
    for sign, chunk in _interleaved_order(pp, rank, virtual, m):
        alive += sign * chunk_bytes[chunk]
        peak = max(peak, alive)
    return peak
