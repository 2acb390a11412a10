"""GPU lookup by name or alias, case-insensitively, with suggestions for typos."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from vramplan.errors import Problem, ScenarioError, UnknownNameError
from vramplan.spec.gpu import GpuSpec
from vramplan.units import GB


def _norm(name: str) -> str:
    """Lower case, '_' as '-', brackets dropped, "12 GB" as "12gb": "RTX 3060 (12 GB)" == "rtx 3060 12gb"."""
    s = name.strip().lower().replace("_", "-").replace("(", " ").replace(")", " ")
    return " ".join(re.sub(r"(\d)\s+gb\b", r"\1gb", s).split())


@lru_cache(maxsize=1)
def _rows() -> list[dict[str, Any]]:
    """The rows of data/gpus.json, read once."""
    rows: list[dict[str, Any]] = json.loads(resources.files("vramplan.catalog").joinpath("data/gpus.json").read_text(encoding="utf-8"))
    return rows


@lru_cache(maxsize=1)
def _catalog() -> tuple[dict[str, GpuSpec], dict[str, str]]:
    by_name: dict[str, GpuSpec] = {}
    index: dict[str, str] = {}
    for row in _rows():
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
    # the same names without spaces or hyphens ("rtx4090", "H100 SXM5 80GB"), where that stays unique
    compact: dict[str, set[str]] = {}
    for key, row_name in list(index.items()):
        compact.setdefault(_compact(key), set()).add(row_name)
    for key, row_names in compact.items():
        if len(row_names) == 1:
            index.setdefault(key, next(iter(row_names)))
    return by_name, index


def _compact(name: str) -> str:
    """``_norm`` without spaces, hyphens or dots: "RTX 4090" == "rtx4090" == "RTX-4090"."""
    return re.sub(r"[^a-z0-9]", "", _norm(name))


def gpu_names() -> list[str]:
    return list(_catalog()[0])


def list_gpus(query: str | None = None) -> list[GpuSpec]:
    rows = list(_catalog()[0].values())
    if query:
        q = _norm(query)
        rows = [g for g in rows if q in _norm(g.name) or any(q in _norm(a) for a in g.aliases)]
    return rows


@lru_cache(maxsize=1)
def _ambiguous() -> dict[str, tuple[str, str]]:
    """Names torch / nvidia-smi print for two cards of different memory (a row's ``ambiguous_names``):
    taking the larger would be optimistic, so the user must say which.  name -> (row, the other card)."""
    out = {}
    for row in _rows():
        for n in row.get("ambiguous_names", {}).get("names", ()):
            out[_norm(n)] = out[_compact(n)] = (row["name"], row["ambiguous_names"]["other_card"])
    return out


def bare_name_note(name: str) -> str | None:
    """An assumption to report when ``name`` is a family name (a row's ``bare_names``, e.g. "a100") that
    the catalog takes for its larger-memory variant."""
    n = _norm(name)
    for row in _rows():
        bare = row.get("bare_names")
        if bare and n in {_norm(x) for x in bare["names"]}:
            return (f"GPU {name!r} taken as {row['name']}; name the variant if it is "
                    f"{' or '.join(bare['other_variants'])} (less memory)")
    return None


def resolve_gpu(name: str, where: str = "hardware.gpu") -> GpuSpec:
    by_name, index = _catalog()
    key = index.get(_norm(name))
    amb = _ambiguous().get(_norm(name)) or _ambiguous().get(_compact(name))
    if key is None and amb is None:
        key = index.get(_compact(name))
    if key is None and amb is not None:
        big, small = amb
        raise ScenarioError([Problem(where, f"{name!r} names two cards ({small} and {big})",
                                     f"use gpu {big!r}, or capacity_gib for the {small} card")])
    if key is None and amb is None:
        key = _sized_name(name)
    if key is None:
        raise UnknownNameError("gpu", name, list(by_name) + [a for g in by_name.values() for a in g.aliases], where)
    return by_name[key]


_SIZE_SUFFIX = re.compile(r"^(.*?)[\s-]*(\d+)gb$")


def _sized_name(name: str) -> str | None:
    """A card named with its memory as a suffix ("A10G-24GB", "RTX 4090 24GB", "L4_24GB", cloud providers'
    spelling) resolves to the row of the bare name when that row's marketed capacity is that many GB; a size
    that does not match the row (an "H100-94GB" for the 80 GB row) resolves to nothing, so the lookup fails
    as before rather than answer with another card's memory."""
    by_name, index = _catalog()
    m = _SIZE_SUFFIX.match(_norm(name))
    if m is None or not m.group(1):
        return None
    base, size = m.group(1), int(m.group(2))
    key = index.get(_norm(base)) or index.get(_compact(base))
    if key is None or _ambiguous().get(_norm(base)) or _ambiguous().get(_compact(base)):
        return None
    return key if round(by_name[key].nominal_memory_bytes / GB) == size else None
