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

* ``interleaved-zero-bubble`` (``ScheduleInterleavedZeroBubble``, arXiv 2401.10241 ZB1P): split backward
  (``split`` rule below).  ``_calculate_single_rank_operations`` takes ``_get_warmup_ops(multiply_factor=1)`` =
  ``min((v - 1) x per_round + (pp - 1 - r), m x v)`` warmup forwards; ``_get_1f1b_rank_ops(...,
  num_1f1b_microbatches=rank, enable_zero_bubble=True)`` then appends, per step, a forward, an input-gradient
  pass (I) and, once ``op - warmup >= rank``, the W pass of the oldest I; the cooldown appends I (+ W) and the
  W passes left over come last.  ``_add_bubbles_to_actions`` only inserts idle slots, so the rank's order of
  actions is this one (``_zb1p_order``).

The zero-bubble schedules split each backward into an input-gradient pass (I, torch's ``BACKWARD_INPUT``) and a
weight-gradient pass (W).  What a chunk-micro-batch holds between them (``split`` rule, ``split_peak_bytes``):
torch's ``stage_backward_input`` (``torch/distributed/pipelining/_backward.py``) runs I with
``retain_graph=True``, so every saved tensor of the chunk stays until its W pass; a pre-hook on each
"intermediate" (the autograd node where a parameter's reverse closure meets the inputs' closure,
``get_param_groups``: the node of the op that consumes the parameter) keeps the gradient flowing into it
(``param_group["grads"]``), i.e. one tensor of that op's output size per parameter-consuming op; and
``PipelineStage.backward_one_chunk`` (stage.py) keeps the chunk's received output gradients in
``backward_state`` until W.  W (``stage_backward_weight``) frees all of it.  The first stage (stage index 0)
skips I and runs the whole backward at W time (``backward_one_chunk``: ``if not self.is_first``), so it holds
its saved tensors and received output gradients until W and no intermediate gradients.  A full backward (B)
frees the chunk's saved tensors at once.  The byte sizes per chunk are the engine's
(``analytic/zero_bubble.py``).

* ``zbv-zero-bubble`` (``ScheduleZBVZeroBubble``, arXiv 2401.10241 sec. 6, ZB-V) and ``dualpipev``
  (``ScheduleDualPipeV``, arXiv 2412.19437's DualPipe folded into a V): ``split`` rule, 2 chunks per rank laid out
  V-shaped (``style`` "v", torch ``generate_stage_to_rank_mapping(style="v")``): rank r holds stages r (local chunk
  0) and 2 pp - 1 - r (local chunk 1), so rank 0 holds the first stage (the embedding) and the last (the final norm
  and the head) (analytic/layout.py ``chunk_stages``).  ``ScheduleZBVZeroBubble._calculate_single_rank_operations``
  (``_zbv_order``) plans ``max(2 pp - 1, m)`` micro-batches, blanking those past m: ``2 (pp - r) - 1`` chunk-0
  forwards, ``r`` (chunk-1, chunk-0) forward pairs, ``pp - r`` chunk-1 (F, I, W) triples, then the stable phase
  ([F0,] I0, W0, F1, I1, W1), then ``r`` (I0, I1) pairs whose W passes wait, ``pp - r`` (I0, W0) pairs and the W
  passes left (chunk 1's, then chunk 0's).  In chunk-micro-batches: 2 pp on every rank (pp 4, m 8: 8, 8, 8, 8).
  ``ScheduleDualPipeV._calculate_single_rank_operations`` (``_dualpipev_order``; torch requires m >= 2 pp) splits
  the backward only outside its main phase: steps 1-3 run ``2 (pp - r - 1)`` F0, ``r + 1`` (F0, F1) pairs and
  ``pp - r - 1`` (I1, W, F1); the main step runs ``m - 2 pp + r + 1`` times the overlapped (F0, B1) and (F1, B0)
  (``OVERLAP_F_B``, whose sub-actions ``_PipelineScheduleRuntime._step_microbatches`` runs one after the other,
  forward first: modelled as the forward then the full backward B); step 5 ``pp - r - 1`` (B1, F1, B0); step 6
  ``r + 1`` (B1, B0) turning into I passes from its middle on; steps 7-8 the queued W passes (the oldest I's, either
  chunk) and the last B0/I0.  In chunk-micro-batches: 2 pp + 1 on every rank (pp 4, m 8: 9, 9, 9, 9).  Modelled is
  this built-in run; a function a trainer registers for ``OVERLAP_F_B`` (``register_custom_function``) to run the
  two at once is not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from vramplan.facts import row_named

__all__ = ["PIPELINE_SCHEDULES", "PipelineSchedule", "in_flight_chunks", "interleaved_rounds", "peak_saved_bytes",
           "pipeline_schedule", "pipeline_schedule_names", "rank_action_order", "rank_actions", "split_peak_bytes"]

InFlightRule = Literal["1f1b", "all", "interleaved", "split"]


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
                     None, "loop", "split",
                     "arXiv 2401.10241 (ZB1P); torch 2.13 ScheduleInterleavedZeroBubble._calculate_single_rank_operations"
                     " (_get_warmup_ops multiply_factor=1, _get_1f1b_rank_ops enable_zero_bubble); _backward.py "
                     "stage_backward_input retain_graph=True"),
    PipelineSchedule("zbv-zero-bubble", "ScheduleZBVZeroBubble", "ZBVZeroBubble", True, 2, 2, "v", "split",
                     "arXiv 2401.10241 sec. 6 (ZB-V); torch 2.13 ScheduleZBVZeroBubble._calculate_single_rank_operations"
                     ", generate_stage_to_rank_mapping(style=v); _backward.py stage_backward_input retain_graph=True"),
    PipelineSchedule("dualpipev", "ScheduleDualPipeV", "DualPipeV", True, 2, 2, "v", "split",
                     "arXiv 2412.19437 (DualPipe); torch 2.13 ScheduleDualPipeV._calculate_single_rank_operations "
                     "(OVERLAP_F_B run as forward then full backward), generate_stage_to_rank_mapping(style=v)"),
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
    >>> [in_flight_chunks(pipeline_schedule("interleaved-zero-bubble"), 4, r, 2, 8) for r in range(4)]
    [8, 8, 8, 8]
    >>> [[in_flight_chunks(pipeline_schedule(n), 4, r, 2, 8) for r in range(4)] for n in ("zbv-zero-bubble", "dualpipev")]
    [[8, 8, 8, 8], [9, 9, 9, 9]]
    """
    if row.in_flight is None:
        raise ValueError(f"pipeline schedule {row.name}: {row.refusal}")
    if pp == 1:
        return virtual
    if row.in_flight == "1f1b":
        return min(m, pp - rank)
    if row.in_flight == "all":
        return m * virtual
    if row.in_flight == "split":
        return split_peak_bytes(rank_action_order(row, pp, rank, virtual, m), (1,) * virtual, (0,) * virtual)
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


def _zb1p_order(pp: int, rank: int, virtual: int, m: int) -> list[tuple[str, int]]:
    """Rank ``rank``'s compute actions under ``ScheduleInterleavedZeroBubble`` as (F | I | W, local chunk), idle
    slots left out: torch 2.13 ``_get_1f1b_rank_ops(enable_zero_bubble=True, num_1f1b_microbatches=rank)`` with
    ``_get_warmup_ops(multiply_factor=1)`` warmup forwards (module docstring)."""
    _, per_round = interleaved_rounds(pp, m)
    total = m * virtual
    warmup = min((virtual - 1) * per_round + (pp - 1 - rank), total)

    def backward_chunk(op: int) -> int:
        return virtual - 1 - ((op - warmup) // per_round) % virtual

    out: list[tuple[str, int]] = []
    backward_ops: list[int] = []
    done = 0  # the W actions written so far
    for op in range(total + warmup):  # warmup forwards, total - warmup (F, I[, W]) steps, warmup (I[, W]) steps
        if op < total:
            out.append(("F", (op // per_round) % virtual))
        if op >= warmup:
            out.append(("I", backward_chunk(op)))
            backward_ops.append(op)
            if op - warmup >= rank:  # the W of the oldest I not yet weighted
                out.append(("W", backward_chunk(backward_ops[done])))
                done += 1
    out.extend(("W", backward_chunk(op)) for op in backward_ops[done:])
    return out


def _zbv_order(pp: int, rank: int, m: int) -> list[tuple[str, int]]:
    """Rank ``rank``'s compute actions under ``ScheduleZBVZeroBubble`` as (F | I | W, local chunk: 0 is stage
    ``rank``, 1 is stage ``2 pp - 1 - rank``), in torch 2.13's ``ScheduleZBVZeroBubble.
    _calculate_single_rank_operations`` order: it plans ``max(2 pp - 1, m)`` micro-batches and blanks the actions
    of those past ``m`` (left out here, as the idle slots)."""
    n = max(2 * pp - 1, m)
    ops: list[tuple[str, int, int]] = []  # (action, local chunk, micro-batch)
    f, b = [0, 0], [0, 0]

    def run(kind: str, chunk: int, count: list[int]) -> None:
        ops.append((kind, chunk, count[chunk]))
        count[chunk] += 1

    for _ in range(2 * (pp - rank) - 1):  # warmup_n1: chunk-0 forwards
        run("F", 0, f)
    for _ in range(rank):  # warmup_n2: (chunk-1, chunk-0) forward pairs
        run("F", 1, f)
        run("F", 0, f)
    for _ in range(pp - rank):  # warmup_n3: chunk-1 F, I, W
        run("F", 1, f)
        ops += [("I", 1, b[1]), ("W", 1, b[1])]
        b[1] += 1
    while f[1] < f[0] or f[0] < n:  # stable phase: [F0,] I0, W0, F1, I1, W1
        if f[0] < n:
            run("F", 0, f)
        ops += [("I", 0, b[0]), ("W", 0, b[0])]
        b[0] += 1
        run("F", 1, f)
        ops += [("I", 1, b[1]), ("W", 1, b[1])]
        b[1] += 1
    w = list(b)
    for _ in range(rank):  # cooldown_n1: I0, I1, their W passes deferred
        run("I", 0, b)
        run("I", 1, b)
    for _ in range(pp - rank):  # cooldown_n2: I0 and the oldest deferred W0
        run("I", 0, b)
        run("W", 0, w)
    ops += [("W", 1, mb) for mb in range(w[1], b[1])] + [("W", 0, mb) for mb in range(w[0], b[0])]
    return [(kind, chunk) for kind, chunk, mb in ops if mb < m]


def _dualpipev_order(pp: int, rank: int, m: int) -> list[tuple[str, int]]:
    """Rank ``rank``'s compute actions under ``ScheduleDualPipeV`` as (F | I | W | B, local chunk: 0 is stage
    ``rank``, 1 is stage ``2 pp - 1 - rank``), in torch 2.13's ``ScheduleDualPipeV._calculate_single_rank_operations``
    order (torch requires ``m >= 2 pp``).  An ``OVERLAP_F_B`` action is its two sub-actions, the forward then the
    full backward: ``_PipelineScheduleRuntime._step_microbatches`` runs ``for sub_a in action.sub_actions:
    _perform_action(sub_a)`` one after the other.  A W pass is the oldest pending I's (``weight_queue``), which may
    be of either chunk."""
    ops: list[tuple[str, int]] = []
    pending: list[int] = []  # chunks of the I passes whose W has not run, oldest first

    def backward(chunk: int, split: bool) -> None:
        ops.append(("I" if split else "B", chunk))
        if split:
            pending.append(chunk)

    def weight() -> None:
        if pending:
            ops.append(("W", pending.pop(0)))

    ops += [("F", 0)] * (2 * (pp - rank - 1))  # step 1: F0
    ops += [("F", 0), ("F", 1)] * (rank + 1)  # step 2: F0 F1
    for _ in range(pp - rank - 1):  # step 3: I1 W F1
        backward(1, True)
        weight()
        ops.append(("F", 1))
    for _ in range(m - 2 * pp + rank + 1):  # step 4: (F0, B1) (F1, B0); the last rank's first F0, B1 not overlapped
        ops += [("F", 0), ("B", 1), ("F", 1), ("B", 0)]
    for _ in range(pp - rank - 1):  # step 5: B1 (F1, B0)
        ops += [("B", 1), ("F", 1), ("B", 0)]
    split = False
    for i in range(rank + 1):  # step 6: B1 B0, I passes from the middle on
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        backward(1, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        backward(0, split)
    for _ in range(pp - rank - 1):  # step 7: W B0
        weight()
        backward(0, split)
    for _ in range(rank + 1):  # step 8: W
        weight()
    return ops


def rank_actions(row: PipelineSchedule, pp: int, rank: int, virtual: int, m: int) -> list[tuple[str, int]]:
    """Rank ``rank``'s compute actions of a ``split`` schedule in torch's order: (F | I | W | B, local chunk; loop
    layout: chunk k is stage ``rank + k pp``, V layout: 0 is stage ``rank``, 1 stage ``2 pp - 1 - rank``)."""
    return list(rank_action_order(row, pp, rank, virtual, m))


# the planner times and sizes many setups of one (schedule, pp, v, micro-batches): the order is built once
@lru_cache(maxsize=1024)
def rank_action_order(row: PipelineSchedule, pp: int, rank: int, virtual: int, m: int) -> tuple[tuple[str, int], ...]:
    """``rank_actions`` as a tuple, built once per argument set."""
    if row.in_flight != "split":
        raise ValueError(f"pipeline schedule {row.name} has no split backward")
    if row.name == "zbv-zero-bubble":
        return tuple(_zbv_order(pp, rank, m))
    if row.name == "dualpipev":
        return tuple(_dualpipev_order(pp, rank, m))
    return tuple(_zb1p_order(pp, rank, virtual, m))


def split_peak_bytes(actions: Sequence[tuple[str, int]], saved: Sequence[int], held: Sequence[int]) -> int:
    """The most bytes a rank holds at once walking ``actions`` (``rank_actions``): F adds the chunk's saved bytes
    ``saved[k]``; I adds what the chunk keeps until W, ``held[k]`` (the intermediates' gradients and the received
    output gradients, module docstring); W frees both; a full backward B frees the saved bytes.

    Hand walk, one chunk, actions F F I F W I W W... : saved 10, held 3:
    F 10, F 20, I 23, F 33 (peak), W 20, ...

    >>> split_peak_bytes([("F", 0), ("F", 0), ("I", 0), ("F", 0), ("W", 0), ("I", 0), ("W", 0)], (10,), (3,))
    33
    """
    alive = peak = 0
    for kind, k in actions:
        alive += {"F": saved[k], "I": held[k], "W": -saved[k] - held[k], "B": -saved[k]}[kind]
        peak = max(peak, alive)
    return peak


def peak_saved_bytes(row: PipelineSchedule, pp: int, rank: int, virtual: int, m: int,
                     chunk_bytes: Sequence[int], held_bytes: Sequence[int] = ()) -> int:
    """The most saved-activation bytes rank ``rank`` holds at once, ``chunk_bytes[k]`` being one micro-batch's
    saved bytes of its local chunk ``k``: 1F1B ``min(m, pp - r)`` micro-batches, GPipe ``m``; interleaved 1F1B
    walks torch's action order, adding a chunk's bytes at each forward and taking them off at its backward,
    so chunks of unequal layers count at their own size.  With equal chunks it is ``in_flight_chunks`` x a chunk.
    A ``split`` schedule walks torch's F, I, W order with ``held_bytes[k]`` kept from a chunk's I to its W
    (``split_peak_bytes``; none given: 0).

    12 layers, pp 4, v 2, m 8, rank 0: chunks of 2 and 1 layers (1 byte a layer); warmup 10 forwards (chunk 0 for
    ops 0-3 and 8-9, chunk 1 for 4-7): 6 x 2 + 4 x 1 = 16; op 11's forward (chunk 0) after op 10's backward
    (chunk 1): 16 + 2 - 1 + 2 = 19, where the count of chunks (11) x the mean chunk (1.5) would say 16.5.

    >>> peak_saved_bytes(pipeline_schedule("interleaved-1f1b"), 4, 0, 2, 8, (2, 1))
    19
    """
    if row.in_flight is None:
        raise ValueError(f"pipeline schedule {row.name}: {row.refusal}")
    if pp > 1 and row.in_flight == "split":
        return split_peak_bytes(rank_action_order(row, pp, rank, virtual, m), chunk_bytes, held_bytes or (0,) * virtual)
    if pp == 1 or row.in_flight != "interleaved":
        return in_flight_chunks(row, pp, rank, virtual, m) * sum(chunk_bytes) // virtual
    alive = peak = 0
    for sign, chunk in _interleaved_order(pp, rank, virtual, m):
        alive += sign * chunk_bytes[chunk]
        peak = max(peak, alive)
    return peak
