"""Speed of the allocator replays on 1,000,000-event workloads.

Two implementations of one model (PyTorch's default caching allocator), three ways in: the reference
``CachingAllocator`` on ``AllocEvent`` objects (``alloc.replay``), the same on a compact stream
(``CachingAllocator.run_compact``, what ``replay_compact`` runs without the C replay or with
``VRAMPLAN_NATIVE=0``) and the C replay (``alloc/_replay.c``, what ``replay_compact`` uses when it was
built).  Workloads (seeded, sizes log-uniform):

* walk: a random walk around ~1,000 live blocks, sizes 512 B to 256 MiB;
* wide: allocations until up to 50,000 blocks are live, then random frees and allocations,
  sizes 512 B to 16 MiB.

Run: ``PYTHONPATH=src python benchmarks/bench_replay.py``.  Each figure is the best of two runs.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable

N_EVENTS = 1_000_000


def _size(rng: random.Random, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(512), math.log(hi))))


def workload(kind: str) -> list[int]:
    """A compact stream: ``n > 0`` allocates the next id, ``-id - 1`` frees it."""
    rng = random.Random(1234)
    live: list[int] = []
    out: list[int] = []
    next_id = 0
    target, hi = (1_000, 256 << 20) if kind == "walk" else (50_000, 16 << 20)
    while len(out) < N_EVENTS:
        grow = len(live) < target if kind == "wide" and next_id < target else rng.random() < target / (
            target + len(live))
        if grow or not live:
            out.append(_size(rng, hi))
            live.append(next_id)
            next_id += 1
        else:
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            out.append(-live.pop() - 1)
    return out


def best(f: Callable[[], object]) -> float:
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    from vramplan.alloc import AllocEvent, CachingAllocator, native, replay, replay_compact

    for kind in ("walk", "wide"):
        stream = workload(kind)
        ids: list[int] = []
        events = []
        for n in stream:
            if n > 0:
                events.append(AllocEvent(len(ids), n))
                ids.append(n)
            else:
                events.append(AllocEvent(-n - 1, -ids[-n - 1]))
        t_event = best(lambda events=events: replay(events))  # type: ignore[misc]
        t_python = best(lambda stream=stream: CachingAllocator().run_compact(stream))  # type: ignore[misc]
        line = (f"{kind}: {len(stream):,} events  CachingAllocator {t_event:.2f} s  "
                f"CachingAllocator.run_compact {t_python:.2f} s")
        if native.available():
            t_c = best(lambda stream=stream: replay_compact(stream))  # type: ignore[misc]
            line += f"  C {t_c * 1e3:.0f} ms"
        else:
            line += "  C: not built"
        print(line)


if __name__ == "__main__":
    main()
