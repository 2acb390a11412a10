"""GPU lookup by name or alias, case-insensitively, with suggestions for typos."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources

from vramplan.errors import Problem, ScenarioError, UnknownNameError
from vramplan.spec.gpu import GpuSpec


def _norm(name: str) -> str:
    """Lower case, '_' as '-', brackets dropped, "12 GB" as "12gb": "RTX 3060 (12 GB)" == "rtx 3060 12gb"."""
    s = name.strip().lower().replace("_", "-").replace("(", " ").replace(")", " ")
    return " ".join(re.sub(r"(\d)\s+gb\b", r"\1gb", s).split())


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    raw = json.loads(resources.files("vramplan.catalog").joinpath("data/gpus.json").read_text(encoding="utf-8"))
    by_name: dict[str, GpuSpec] = {}
    index: dict[str, str] = {}
    for row in raw:
        spec = GpuSpec(
            name=row["name"], vendor=row.get("vendor", "nvidia"), architecture=row.get("architecture", "unknown"),
            compute_capability=str(row.get("compute_capability", "")),
            nominal_memory_bytes=int(row.get("nominal_memory_bytes") or 0),
            # No published totalGlobalMem: fall back to the marketed decimal capacity, which is
            # below what the device really reports (80 GB -> 74.5 GiB vs 79.25 GiB), so never optimistic.
            total_memory_bytes=int(row.get("total_memory_bytes") or row.get("nominal_memory_bytes") or 0),
            hbm_bytes_per_s=int(row.get("hbm_bytes_per_s") or 0),
            dense_flops_per_s=dict(row.get("dense_flops_per_s") or {}),
            interconnect=str(row.get("interconnect", "pcie")),
            interconnect_bytes_per_s=int(row.get("interconnect_bytes_per_s") or 0),
            host_link=str(row.get("host_link", "")), host_link_bytes_per_s=int(row.get("host_link_bytes_per_s") or 0),
            l2_bytes=int(row.get("l2_bytes") or 0), smem_per_sm_bytes=int(row.get("smem_per_sm_bytes") or 0),
            sm_count=int(row.get("sm_count") or 0), aliases=tuple(row.get("aliases", ())),
            sources=tuple(row.get("sources", ())), notes=str(row.get("notes", "")),
        )
        by_name[spec.name] = spec
        for key in (spec.name, *spec.aliases):
            index.setdefault(_norm(key), spec.name)
    return by_name, index


def gpu_names() -> list[str]:
    return list(_catalog()[0])


def list_gpus(query: str | None = None) -> list[GpuSpec]:
    rows = list(_catalog()[0].values())
    if query:
        q = _norm(query)
        rows = [g for g in rows if q in _norm(g.name) or any(q in _norm(a) for a in g.aliases)]
    return rows


# Names that torch / nvidia-smi print for two cards of different memory: taking the larger would be
# optimistic, so the user must say which.  name -> (the catalog row of the larger card, the smaller card)
_AMBIGUOUS: dict[str, tuple[str, str]] = {
    _norm(n): ("RTX-4060-Ti-16GB", "8 GB")
    for n in ("RTX 4060 Ti", "RTX-4060-Ti", "4060 Ti", "4060ti", "GeForce RTX 4060 Ti", "NVIDIA GeForce RTX 4060 Ti")
}


def resolve_gpu(name: str, where: str = "hardware.gpu") -> GpuSpec:
    by_name, index = _catalog()
    key = index.get(_norm(name))
    if key is None and _norm(name) in _AMBIGUOUS:
        big, small = _AMBIGUOUS[_norm(name)]
        raise ScenarioError([Problem(where, f"{name!r} names two cards ({small} and {big})",
                                     f"use gpu {big!r}, or capacity_gib for the {small} card")])
    if key is None:
        raise UnknownNameError("gpu", name, list(by_name) + [a for g in by_name.values() for a in g.aliases], where)
    return by_name[key]
