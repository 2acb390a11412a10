"""``vramplan.record()``: arm PyTorch's allocator history and dump a snapshot on CUDA OOM.

    with vramplan.record(path="oom.pickle"):
        train()          # on torch.OutOfMemoryError: oom.pickle is written, the error re-raised

Then ``vramplan snapshot oom.pickle`` explains it.  Uses the documented (underscore) API of
PyTorch 2.x: ``torch.cuda.memory._record_memory_history(enabled="all", context="all",
stacks=..., max_entries=...)`` and ``torch.cuda.memory._snapshot()``.  On a machine without
CUDA (or without torch) it warns once per process and does nothing else.
"""

from __future__ import annotations

import logging
import os
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

__all__ = ["record"]

_log = logging.getLogger("vramplan")
_warned = False


def _warn_once(message: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _write_snapshot(data: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as fh:
        pickle.dump(data, fh)
    os.replace(tmp, path)


@contextmanager
def record(path: str | os.PathLike[str] = "vramplan_oom_snapshot.pickle", max_entries: int = 100_000, *,
           stacks: Literal["python", "all"] = "python", dump_on_exit: bool = False) -> Iterator[None]:
    """Record allocator history inside the block; on ``torch.OutOfMemoryError`` dump and re-raise.

    ``max_entries`` bounds the trace (a ring buffer: the last events are kept; each costs a few
    hundred bytes of host memory plus its stack).  ``stacks="all"`` adds C++ frames (slower).
    ``dump_on_exit=True`` also writes the snapshot when the block ends normally.
    Recording is switched off when the block ends.
    """
    if max_entries < 1:
        raise ValueError("max_entries must be >= 1")
    target = Path(path)
    try:
        import torch
    except ImportError:
        _warn_once("vramplan.record(): torch is not installed; nothing is recorded")
        yield
        return
    if not torch.cuda.is_available():
        _warn_once("vramplan.record(): CUDA is not available on this machine; nothing is recorded")
        yield
        return
    memory = torch.cuda.memory
    oom_error: type[BaseException] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=max_entries)
    try:
        yield
    except oom_error as exc:
        try:
            _write_snapshot(memory._snapshot(), target)
        except (OSError, RuntimeError, pickle.PicklingError) as dump_exc:  # never hide the OOM
            _log.error("vramplan.record(): could not write %s: %s", target, dump_exc)
        else:
            _log.error("vramplan.record(): memory snapshot written to %s", target)
            exc.add_note(f"vramplan: memory snapshot written to {target}; "
                         f"explain it with `vramplan snapshot {target}`")
        raise
    else:
        if dump_on_exit:
            _write_snapshot(memory._snapshot(), target)
    finally:
        memory._record_memory_history(enabled=None)
