"""From the tracker's allocation events to the memory content at the peak, part by part.

The storage tracker (``vramplan.trace.tracker.Tracker``) records one event per storage
allocation (+bytes) and release (-bytes), each with the *category* that was current when
the storage was first seen.  ``measure`` sets the category while each part of the step runs
(forward, backward, optimizer, ...), so that the live storages at any instant can be sorted
into the report's parts:

================  ======================================  =============================
category          part at the peak                        sub-part
================  ======================================  =============================
weights           weights                                 parameters
buffers, inputs   other                                   buffers / inputs
optimizer_states  optimizer_states                        (the optimizer's name)
forward           activations                             forward tensors
autocast          temporaries                             autocast weight copies
logits            temporaries                             logits and loss
backward          gradients if alive at the end, else     parameter gradients /
                  temporaries                             backward
optimizer         optimizer_states if alive at the end,   (name) / optimizer step
                  else temporaries
kv_cache          kv_cache                                cache
prefill, decode   activations                             running layer
generate          temporaries                             logits processing
================  ======================================  =============================

"Alive at the end" means still allocated when the measured step has finished (the model's
gradients and the optimizer's states are; a backward temporary is not).

Pure functions over a list of events; no torch.  Worked example: events
``+100 (weights), +40 (forward), +60 (forward), -40, +10 (backward)``: the running sum is
100, 140, 200, 160, 170; the peak is 200 bytes after the third event, with weights 100 and
activations 100.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "AUTOCAST", "BACKWARD", "BUFFERS", "DECODE", "FORWARD", "GENERATE", "INPUTS", "KV_CACHE", "LOGITS",
    "OPTIMIZER", "OPTIMIZER_STATES", "PREFILL", "WEIGHTS", "EventLike", "Peak", "classify", "find_peak",
    "live_at", "phase_of", "phase_peaks",
]

WEIGHTS = "weights"
BUFFERS = "buffers"
INPUTS = "inputs"
OPTIMIZER_STATES = "optimizer_states"
FORWARD = "forward"
AUTOCAST = "autocast"
LOGITS = "logits"
BACKWARD = "backward"
OPTIMIZER = "optimizer"
KV_CACHE = "kv_cache"
PREFILL = "prefill"
DECODE = "decode"
GENERATE = "generate"


class EventLike(Protocol):
    """What ``vramplan.trace.tracker.TrackEvent`` provides."""

    @property
    def storage_id(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def category(self) -> str: ...


@dataclass(frozen=True)
class Peak:
    index: int  # position in the event list after which the live bytes are highest (-1: before any)
    bytes: int


def find_peak(events: Sequence[EventLike], start: int = 0, stop: int | None = None, base_bytes: int = 0) -> Peak:
    """The first maximum of the running sum of ``events[start:stop]`` (``base_bytes`` live before)."""
    stop = len(events) if stop is None else stop
    live = best = base_bytes
    where = start - 1
    for i in range(start, stop):
        live += events[i].nbytes
        if live > best:
            best, where = live, i
    return Peak(where, best)


def live_at(events: Sequence[EventLike], index: int) -> dict[int, tuple[str, int]]:
    """Storages alive just after ``events[index]``: storage id -> (category, bytes)."""
    alive: dict[int, tuple[str, int]] = {}
    for e in events[: index + 1]:
        if e.nbytes > 0:
            alive[e.storage_id] = (e.category, e.nbytes)
        else:
            alive.pop(e.storage_id, None)
    return alive


def phase_peaks(events: Sequence[EventLike], marks: Sequence[tuple[int, str]]) -> dict[str, int]:
    """Highest live bytes inside each phase; ``marks`` = (first event index, phase name), in order.

    Events before the first mark count as set-up (their bytes are live in every phase).
    """
    out: dict[str, int] = {}
    live = 0
    bounds = list(marks) + [(len(events), "")]
    first = bounds[0][0] if bounds else len(events)
    for e in events[:first]:
        live += e.nbytes
    for (begin, name), (end, _) in itertools.pairwise(bounds):
        best = live
        for e in events[begin:end]:
            live += e.nbytes
            best = max(best, live)
        out[name] = max(out.get(name, 0), best)
    return out


def phase_of(index: int, marks: Sequence[tuple[int, str]], default: str = "setup") -> str:
    """The phase an event index falls in."""
    name = default
    for begin, phase in marks:
        if index >= begin:
            name = phase
    return name


_FIXED: dict[str, tuple[str, str]] = {
    WEIGHTS: ("weights", "parameters"),
    BUFFERS: ("other", "buffers"),
    INPUTS: ("other", "inputs"),
    FORWARD: ("activations", "forward tensors"),
    AUTOCAST: ("temporaries", "autocast weight copies"),
    LOGITS: ("temporaries", "logits and loss"),
    KV_CACHE: ("kv_cache", "cache"),
    PREFILL: ("activations", "running layer"),
    DECODE: ("activations", "running layer"),
    GENERATE: ("temporaries", "logits processing"),
}


def classify(
    alive: dict[int, tuple[str, int]], alive_at_end: Iterable[int], optimizer_name: str = "optimizer",
) -> dict[str, dict[str, int]]:
    """Sort live storages into report parts -> sub-parts -> bytes (see the module table)."""
    end = set(alive_at_end)
    out: dict[str, dict[str, int]] = {}

    def add(part: str, sub: str, nbytes: int) -> None:
        out.setdefault(part, {})
        out[part][sub] = out[part].get(sub, 0) + nbytes

    for sid, (category, nbytes) in alive.items():
        if category in _FIXED:
            add(*_FIXED[category], nbytes)
        elif category == OPTIMIZER_STATES:
            add("optimizer_states", optimizer_name, nbytes)
        elif category == BACKWARD:
            add(*(("gradients", "parameter gradients") if sid in end else ("temporaries", "backward")), nbytes)
        elif category == OPTIMIZER:
            add(*(("optimizer_states", optimizer_name) if sid in end else ("temporaries", "optimizer step")), nbytes)
        else:
            add("other", category, nbytes)
    return out
