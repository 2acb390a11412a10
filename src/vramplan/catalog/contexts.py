"""Published CUDA/HIP context sizes, one row per measurement (``data/cuda_context.json``).

Each row records what was measured on which GPU and software stack, with the source URL and a
verbatim quote.  Rows measured from a PyTorch out-of-memory message keep the printed figures
(``oom``) and their ``bytes`` is recomputed from them here, so a row cannot drift from its quote:

* ``oom_message`` (PyTorch >= 2.1, CUDA): outside = "this process has X in use" - "Y is allocated
  by PyTorch" - "Z is reserved by PyTorch but unallocated".  Example (CatVTON #133, T4):
  4.11 GiB - 3.72 GiB - 264.21 MiB = 0.39 x 2^30 - 264.21 x 2^20 = 418,759,311.36 - 277,044,264.96
  = 141,715,046.4 -> 141,715,046 B (135.15 MiB).  Each printed figure is rounded to two decimals,
  so the difference is good to about +-10 MiB.
* ``oom_message_device`` (HIP messages have no per-process figure): total - free - allocated -
  reserved-but-unallocated, device-wide.

The selection rule that turns rows into the engine's value lives in
``vramplan.analytic.overhead.cuda_context``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from importlib import resources

_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1}


def parse_size(text: str) -> Fraction:
    """``"4.11 GiB"`` -> exact bytes as a fraction (PyTorch prints two decimals of a binary unit)."""
    number, unit = text.split()
    return Fraction(number) * _UNITS[unit]


@dataclass(frozen=True)
class ContextRow:
    id: str
    gpu: str
    architecture: str
    vendor: str
    module_loading: str  # lazy | eager | n/a (ROCm)
    loading_basis: str
    cuda: str | None
    rocm: str | None
    torch: str | None
    measured: str
    bytes: int
    source: str
    quote: str
    notes: str
    oom: tuple[tuple[str, str], ...] = ()

    def derived_bytes(self) -> int | None:
        """``bytes`` recomputed from the printed OOM figures; None for direct readings."""
        o = dict(self.oom)
        if not o:
            return None
        if "total" in o:
            v = parse_size(o["total"]) - parse_size(o["free"]) - parse_size(o["allocated"])
        else:
            v = parse_size(o["in_use"]) - parse_size(o["allocated"])
        return round(v - parse_size(o["reserved_unallocated"]))


@lru_cache(maxsize=1)
def context_rows() -> tuple[ContextRow, ...]:
    raw = json.loads(resources.files("vramplan.catalog").joinpath("data/cuda_context.json")
                     .read_text(encoding="utf-8"))
    rows = []
    for r in raw["rows"]:
        rows.append(ContextRow(
            id=r["id"], gpu=r["gpu"], architecture=r["architecture"], vendor=r["vendor"],
            module_loading=r["module_loading"], loading_basis=r["loading_basis"], cuda=r.get("cuda"),
            rocm=r.get("rocm"), torch=r.get("torch"), measured=r["measured"], bytes=int(r["bytes"]),
            source=r["source"], quote=r["quote"], notes=r.get("notes", ""),
            oom=tuple((r.get("oom") or {}).items()),
        ))
    return tuple(rows)
