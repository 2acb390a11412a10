"""``Term``: one memory term of a training step, as a small frozen record that knows its bytes.

Like vLLM's ``KVCacheSpec`` family (vllm/v1/kv_cache_interface.py), each kind of memory is a record
rather than a line inside one long function: its declared key (analytic/moment.py ``K``), its bytes,
where on the step's timeline it is born and where it dies (analytic/timeline.py ``Loc``), where it
lives (the device, the host, NVMe, CUDA managed memory), and, for the allocator's event stream, what
it is (``name``, with the layer it belongs to) and how its bytes split into allocations (``tensors``).

A term with negative bytes is a release: the part of an earlier term of the same key that is freed
between two points of the timeline (the saved tensors an MLP's backward frees before the attention's
backward); it has no allocation of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Self

from vramplan.analytic.moment import Key
from vramplan.analytic.timeline import END, FORWARD, Loc

__all__ = ["WHERE", "Term", "by_layer", "bytes_of", "device_terms", "layer_table", "resident", "tables", "totals"]

WHERE = ("device", "host", "nvme", "managed")


class _TermFields(NamedTuple):
    key: Key
    nbytes: int
    born: Loc
    dies: Loc
    name: str
    layer: int = -1
    where: str = "device"
    fields: tuple[tuple[str, str], ...] = ()
    tensors: tuple[int, ...] = ()


_tuple_new = tuple.__new__


class Term(_TermFields):
    """``nbytes`` under ``key`` from ``born`` up to (not including) ``dies``.

    ``name``: what the term is, unique with ``layer`` in a step (``"saved.kept"`` of layer 3), which
    the event stream reads.  ``fields``: a templated key's label fields (the optimizer's name).
    ``tensors``: the allocations the bytes are made of, when the term knows them (empty: one).

    An immutable named tuple rather than a frozen dataclass: a step makes one term per layer per
    per-layer term (some 740 for Llama 3 70B), and a frozen dataclass's ``__init__`` (one
    ``object.__setattr__`` per field) cost 2.5 us each against 1 us here, validation included
    (benchmarks/bench_estimate.txt).
    """

    __slots__ = ()

    def __new__(cls, key: Key, nbytes: int, born: Loc, dies: Loc, name: str, layer: int = -1,
                where: str = "device", fields: tuple[tuple[str, str], ...] = (),
                tensors: tuple[int, ...] = ()) -> Self:
        if where not in WHERE:
            raise ValueError(f"where must be one of {WHERE}, not {where!r}")
        if tensors and sum(tensors) != nbytes:
            raise ValueError(f"{name}: tensors sum to {sum(tensors)}, not {nbytes}")
        if not born.order < dies.order:
            raise ValueError(f"{name}: dies ({dies}) before it is born ({born})")
        # what the named tuple's own __new__ does, without its extra frame
        out: Self = _tuple_new(cls, (key, nbytes, born, dies, name, layer, where, fields, tensors))
        return out


def device_terms(key: Key, rows: Iterable[tuple[int, Loc, Loc, str, int]]) -> list[Term]:
    """Device terms under ``key`` from (bytes, born, dies, name, layer) rows: a per-layer family's records
    (one per layer per term) made without a ``Term.__new__`` frame each, with the same check (a device
    term with no tensors can only die before it is born).

    A row of 0 bytes makes no record: it would add nothing to a moment and allocate nothing (no saved
    tensor to recompute without checkpointing, no gradient on the GPU when the optimizer is offloaded),
    and readers by name read 0 for a layer without one (``by_layer``, ``layer_table``)."""
    out: list[Term] = []
    for nbytes, born, dies, name, layer in rows:
        if not born.order < dies.order:
            raise ValueError(f"{name}: dies ({dies}) before it is born ({born})")
        if nbytes:
            out.append(_tuple_new(Term, (key, nbytes, born, dies, name, layer, "device", (), ())))
    return out


def resident(key: Key, nbytes: int, name: str, where: str = "device", **fields: str) -> Term:
    """A term alive for the whole step (created before it, kept after it)."""
    return Term(key, nbytes, FORWARD, END, name, where=where, fields=tuple(sorted(fields.items())))


def bytes_of(terms: Iterable[Term], name: str, where: str | None = None) -> int:
    """Total bytes of the terms called ``name`` (optionally only those living in ``where``)."""
    return sum(t.nbytes for t in terms if t.name == name and (where is None or t.where == where))


def by_layer(terms: Sequence[Term], name: str, n_layers: int) -> list[int]:
    """Bytes of the per-layer terms called ``name``, indexed by layer (0 where a layer has none)."""
    out = [0] * n_layers
    for t in terms:
        if t.name == name and 0 <= t.layer < n_layers:
            out[t.layer] += t.nbytes
    return out


def totals(terms: Iterable[Term]) -> dict[str, int]:
    """Bytes of the step-wide terms (not a layer's) by name: ``bytes_of`` for every name in one pass."""
    out: dict[str, int] = {}
    for _key, nbytes, _born, _dies, name, layer, _where, _fields, _tensors in terms:
        if layer < 0:
            out[name] = out.get(name, 0) + nbytes
    return out


def layer_table(terms: Iterable[Term], n_layers: int) -> dict[str, list[int]]:
    """``by_layer`` for every per-layer name in one pass (a name a layer lacks reads 0 there)."""
    out: dict[str, list[int]] = {}
    for _key, nbytes, _born, _dies, name, layer, _where, _fields, _tensors in terms:
        if 0 <= layer < n_layers:
            row = out.get(name)
            if row is None:
                row = out[name] = [0] * n_layers
            row[layer] += nbytes
    return out


def tables(terms: Iterable[Term], n_layers: int) -> tuple[dict[str, int], dict[str, list[int]], dict[int, int]]:
    """``totals``, ``layer_table`` and the step-wide device bytes by key (its identity: declared keys are
    singletons) in one pass over the terms: what the event stream reads (analytic/events.py)."""
    step: dict[str, int] = {}
    layers: dict[str, list[int]] = {}
    by_key: dict[int, int] = {}
    for key, nbytes, _born, _dies, name, layer, where, _fields, _tensors in terms:
        if layer < 0:
            step[name] = step.get(name, 0) + nbytes
            if where == "device":
                k = id(key)
                by_key[k] = by_key.get(k, 0) + nbytes
        elif layer < n_layers:
            row = layers.get(name)
            if row is None:
                row = layers[name] = [0] * n_layers
            row[layer] += nbytes
    return step, layers, by_key
