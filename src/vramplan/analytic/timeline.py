"""The training step as a timeline, and the sweep that turns memory terms into moments.

Memory is not summed over a step: it is looked at the instants where it can peak (``Point``), in
the order the step reaches them:

1. ``forward``: the end of the forward pass, at the loss's log_softmax (a stage without the head:
   its last layer's forward);
2. ``loss``: the start of the backward pass, at the loss gradient (the stage with the head);
3. per layer, from the last to the first: ``mlp`` (the MLP's backward, while the whole layer's
   saved tensors are still there) then ``attention`` (after the MLP's saved tensors are released;
   only for layers that release some before it);
4. ``embedding``: the tied embedding's backward, last (when its two gradient contributions are
   summed);
5. ``step``: ``optimizer.step()``.

A term (``analytic/terms``) lives from the location where it is born up to, not including, the
location where it dies (``Loc``); locations that are not points of a scenario's timeline (a layer
without an attention point) still order the others.  ``sweep`` sums, at each point, the terms alive
there by declared key, so the moments come from the terms alone.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from itertools import accumulate
from typing import TYPE_CHECKING

from vramplan.analytic.moment import Key, Moment

if TYPE_CHECKING:
    from vramplan.analytic.terms.base import Term

__all__ = [
    "END",
    "FORWARD",
    "LOSS",
    "STEP",
    "TIED_EMBEDDING",
    "Loc",
    "Point",
    "Timeline",
    "attention",
    "layer_done",
    "mlp",
    "step_timeline",
    "sweep",
    "sweep_peak",
    "sweep_totals",
]

# order of each kind of location; the layers' locations sort among themselves by layer, last first
_RANK = {"forward": 0, "loss": 1, "mlp": 2, "attention": 2, "layer_done": 2, "embedding": 3, "step": 4, "end": 5}
_WITHIN = {"mlp": 0, "attention": 1, "layer_done": 2}


@dataclass(frozen=True)
class Loc:
    """A location on the step's timeline: a phase edge, or a part of one layer's backward.

    ``layer_done`` is the end of a layer's backward (after its attention part): what dies there is
    seen by neither of that layer's points but by nothing after them either.
    """

    at: str
    layer: int = -1
    # where it sorts on the timeline; backward runs from the last layer to the first, so a larger
    # layer index comes first
    order: tuple[int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.at not in _RANK:
            raise ValueError(f"unknown location {self.at!r}: one of {sorted(_RANK)}")
        object.__setattr__(self, "order", (_RANK[self.at], -self.layer if self.at in _WITHIN else 0,
                                           _WITHIN.get(self.at, 0)))


FORWARD = Loc("forward")
LOSS = Loc("loss")
TIED_EMBEDDING = Loc("embedding")
STEP = Loc("step")
END = Loc("end")  # after the step: what lives until here is resident for the whole step


@lru_cache(maxsize=4096)
def mlp(j: int) -> Loc:
    """Layer ``j``'s backward, MLP part (its whole saved set still alive)."""
    return Loc("mlp", j)


@lru_cache(maxsize=4096)
def attention(j: int) -> Loc:
    """Layer ``j``'s backward, attention part (after the MLP's saved tensors are released)."""
    return Loc("attention", j)


@lru_cache(maxsize=4096)
def layer_done(j: int) -> Loc:
    """The end of layer ``j``'s backward."""
    return Loc("layer_done", j)


@dataclass(frozen=True)
class Point:
    """An instant where memory can peak: a location and the phase the report names it by.

    ``shown``: keys the moment lists even at 0 bytes (the attention part's saved tensors and layer
    temporaries are always listed, as measured rows of that moment).
    """

    loc: Loc
    phase: str
    shown: frozenset[Key] = frozenset()


@dataclass(frozen=True)
class Timeline:
    points: tuple[Point, ...]

    @cached_property
    def orders(self) -> list[tuple[int, int, int]]:
        """Where each point sorts (``Loc.order``), in the points' order: what ``sweep`` bisects."""
        return [pt.loc.order for pt in self.points]

    @cached_property
    def index(self) -> dict[int, int]:
        """Each point's index by its location's identity (the timeline holds its locations)."""
        out: dict[int, int] = {}
        for i, pt in enumerate(self.points):
            out.setdefault(id(pt.loc), i)
        return out


def step_timeline(n_layers: int, has_head: bool, attention_split: Sequence[bool], tied_end: bool,
                  shown_at_attention: frozenset[Key] = frozenset()) -> Timeline:
    """The points of one pipeline stage's step, in the order they occur.

    ``attention_split[j]``: layer ``j`` releases saved tensors between its MLP's and its attention's
    backward, so its attention part is a moment of its own.
    """
    return _step_timeline(n_layers, has_head, tuple(attention_split), tied_end, shown_at_attention)


# a timeline is immutable and the same for every estimate of a model with the same layer plan: the
# planner's solvers estimate one model many times
@lru_cache(maxsize=256)
def _step_timeline(n_layers: int, has_head: bool, attention_split: tuple[bool, ...], tied_end: bool,
                   shown_at_attention: frozenset[Key]) -> Timeline:
    pts = [Point(FORWARD, "forward")]
    if has_head:
        pts.append(Point(LOSS, "backward"))
    for j in range(n_layers - 1, -1, -1):
        pts.append(Point(mlp(j), "backward"))
        if attention_split[j]:
            pts.append(Point(attention(j), "backward", shown_at_attention))
    if tied_end:
        pts.append(Point(TIED_EMBEDDING, "backward"))
    pts.append(Point(STEP, "optimizer"))
    return Timeline(tuple(pts))


def sweep(terms: Sequence[Term], timeline: Timeline) -> list[Moment]:
    """One moment per point: the device terms alive there, summed by key (keys in the terms' order).

    A key whose alive terms sum to 0 is left out (as ``Moment.add`` does), unless the point shows it.
    Each term adds its bytes at the first point at or after its birth and takes them back at the first
    point at or after its death (a running sum per key), so the sweep is linear in terms and points.
    """
    return sweep_totals(terms, timeline)[0]


def _spans(terms: Sequence[Term], timeline: Timeline) -> Iterator[tuple[Key, tuple[tuple[str, str], ...], int, int, int]]:
    """Each device term that is alive at some point: (key, label fields, bytes, the point index of its birth, of its
    death).  A term adds its bytes at the first point at or after its birth and takes them back at the first point at
    or after its death; the point index of each location is found by its identity (the terms hold their locations
    while this runs), bisected once per location: the per-layer locations are singletons (``mlp(j)``)."""
    orders = timeline.orders
    at = dict(timeline.index)
    at_get = at.get
    for key, nbytes, born, dies, _name, _layer, where, fields, _tensors in terms:
        if not nbytes or where != "device":
            continue
        i0 = at_get(id(born))
        if i0 is None:
            i0 = at[id(born)] = bisect_left(orders, born.order)
        i1 = at_get(id(dies))
        if i1 is None:
            i1 = at[id(dies)] = bisect_left(orders, dies.order)
        if i0 < i1:
            yield key, fields, nbytes, i0, i1


def sweep_totals(terms: Sequence[Term], timeline: Timeline) -> tuple[list[Moment], list[int]]:
    """``sweep`` and each moment's ``total``, from the same running sums (no second pass)."""
    points = timeline.points
    n = len(timeline.orders)
    # keyed by the key's identity (declared keys are singletons) and its label fields
    change: dict[tuple[int, tuple[tuple[str, str], ...]], list[int]] = {}
    keys: dict[int, Key] = {}
    last_key: Key | None = None
    last_fields: tuple[tuple[str, str], ...] = ()
    d: list[int] = []
    for key, fields, nbytes, i0, i1 in _spans(terms, timeline):
        if key is not last_key or fields != last_fields:  # a family's terms come together: one look-up
            last_key, last_fields = key, fields
            kf = (id(key), fields)
            got = change.get(kf)
            if got is None:
                keys[kf[0]] = key
                got = change[kf] = [0] * (n + 1)
            d = got
        d[i0] += nbytes
        d[i1] -= nbytes
    shown_at: dict[int, set[int]] = {}  # key -> the points that show it
    for i, pt in enumerate(points):
        for key in pt.shown:
            keys[id(key)] = key
            change.setdefault((id(key), ()), [0] * (n + 1))
            shown_at.setdefault(id(key), set()).add(i)
    # per row: (part, label formatted once, bytes at each point, the points that show it), in the
    # terms' order
    rows = [(keys[kid].part, keys[kid].name(**dict(fields)), list(accumulate(d)), shown_at.get(kid, _NONE))
            for (kid, fields), d in change.items()]
    # each moment's total: the rows' bytes at its point, summed column by column
    totals = list(map(sum, zip(*[row[2] for row in rows])))[:n] if rows else [0] * n
    return [_SweptMoment(pt.phase, rows, i, totals[i]) for i, pt in enumerate(points)], totals


def sweep_peak(terms: Sequence[Term], timeline: Timeline) -> int:
    """``max(sweep_totals(terms, timeline)[1])`` without the moments: one running sum over every key.

    Each total of ``sweep_totals`` is the sum over its rows of a row's running sum at the point, and each row's
    running sum adds a term's bytes from the point of its birth up to the point of its death (``_spans``, as here);
    so one running sum of every device term's bytes, kept per point, gives the same integers (the rows a point only
    shows are 0).  The planner's step floor (``engine.train_step_floor_bytes``) reads only this, not the moments'
    parts."""
    n = len(timeline.orders)
    d = [0] * (n + 1)
    for _key, _fields, nbytes, i0, i1 in _spans(terms, timeline):
        d[i0] += nbytes
        d[i1] -= nbytes
    return max(list(accumulate(d))[:n])


_NONE: frozenset[int] = frozenset()
_Row = tuple[str, str, list[int], "set[int] | frozenset[int]"]


class _SweptMoment(Moment):
    """A moment of the sweep, its parts filled from the sweep's rows when first read.

    A step has a moment per layer part (some 160 for Llama 3 70B) and an estimate reads the parts of
    one, the peak, and the totals of all (the report's ``phases``): the total comes from the sweep's
    running sum.  Read, the parts are what ``Moment.set`` would make (rows in the terms' order; a key
    whose alive terms sum to 0 left out unless the point shows it), and the moment is a plain one.
    """

    def __init__(self, phase: str, rows: list[_Row], i: int, total: int) -> None:
        self.phase = phase
        self.__post_init__()  # the phase is declared
        self._rows, self._i, self._total = rows, i, total
        self._parts: dict[str, dict[str, int]] | None = None

    @property
    def parts(self) -> dict[str, dict[str, int]]:
        if self._parts is None:
            i = self._i
            parts: dict[str, dict[str, int]] = {}
            for part, label, vals, shown in self._rows:
                v = vals[i]
                if v or i in shown:
                    row = parts.get(part)
                    if row is None:
                        row = parts[part] = {}
                    row[label] = v
            self._parts = parts
        return self._parts

    @parts.setter
    def parts(self, value: dict[str, dict[str, int]]) -> None:
        self._parts = value

    @property
    def total(self) -> int:
        return self._total if self._parts is None else super().total
