"""The step's timeline: live bytes over the step by category, the peak, and what is alive then.

``timeline(events, marks)`` returns plain data (JSON-ready); ``write_timeline(path, data)``
writes it as ``.json``, ``.html`` (a self-contained SVG chart, no scripts) or ``.png``
(matplotlib, from the ``plot`` extra).  Sizes are rounded to 512 bytes per block, as
``torch.cuda.memory_allocated`` counts them, so the peak matches the report's
``peak_allocated_bytes``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from vramplan.errors import MissingExtraError, Problem, ScenarioError
from vramplan.report import BREAKDOWN_KEYS
from vramplan.trace.report import label, peak_of, rounded
from vramplan.trace.tracker import TrackEvent
from vramplan.units import GiB

__all__ = ["timeline", "write_timeline"]

MAX_POINTS = 1500
_NAMED = ("weights", "gradients", "optimizer_states", "master_weights")
COLORS = {
    "weights": "#4c72b0", "gradients": "#dd8452", "optimizer_states": "#55a868", "master_weights": "#8172b3",
    "activations": "#c44e52", "kv_cache": "#937860", "temporaries": "#da8bc3", "other": "#8c8c8c",
}


def timeline(events: list[TrackEvent], marks: list[tuple[int, str]], top: int = 10) -> dict[str, Any]:
    """Samples of live bytes per category, the phases, the peak and its largest live blocks."""
    pk = peak_of(events, marks)
    step = max(1, len(events) // MAX_POINTS)
    live = dict.fromkeys(BREAKDOWN_KEYS, 0)
    sizes: dict[int, tuple[int, str]] = {}
    points: list[dict[str, int]] = []
    for i, ev in enumerate(events):
        if ev.nbytes > 0:
            cat = ev.category if ev.category in live else "other"
            sizes[ev.storage_id] = (rounded(ev.nbytes), cat)
            live[cat] += rounded(ev.nbytes)
        else:
            got = sizes.pop(ev.storage_id, None)
            if got is not None:
                live[got[1]] -= got[0]
        if i % step == 0 or ev.seq == pk.seq or i == len(events) - 1:
            points.append({"seq": ev.seq, **live})
    alive = sorted(pk.alive, key=lambda e: -e.nbytes)[:top]
    return {
        "unit": "bytes",
        "categories": list(BREAKDOWN_KEYS),
        "points": points,
        "phases": [{"seq": seq, "phase": ph} for seq, ph in sorted(marks)],
        "peak": {"seq": pk.seq, "allocated_bytes": pk.allocated_bytes, "phase": pk.phase,
                 "breakdown": pk.breakdown},
        "top_at_peak": [{"bytes": rounded(e.nbytes), "category": e.category, "module": e.module or "",
                         "op": e.op, "what": e.op if e.category in _NAMED else label(e)} for e in alive],
    }


def write_timeline(path: str | Path, data: dict[str, Any]) -> Path:
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".json":
        p.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    elif suffix in (".html", ".htm"):
        p.write_text(_html(data), encoding="utf-8")
    elif suffix == ".png":
        _png(p, data)
    else:
        raise ScenarioError([Problem("--timeline", f"unknown timeline format {p.suffix!r}",
                                     "name a .png, .html or .json file")])
    return p


def _stacks(data: dict[str, Any]) -> tuple[list[int], dict[str, list[int]]]:
    xs = [pt["seq"] for pt in data["points"]]
    return xs, {c: [pt[c] for pt in data["points"]] for c in data["categories"]}


def _svg(data: dict[str, Any], width: int = 960, height: int = 360) -> str:
    xs, series = _stacks(data)
    if not xs:
        return "<svg/>"
    x0, x1 = xs[0], max(xs[-1], xs[0] + 1)
    ymax = max(data["peak"]["allocated_bytes"], 1)
    pad_l, pad_b = 60, 30
    w, h = width - pad_l - 10, height - pad_b - 10

    def px(x: int) -> float:
        return pad_l + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return float(10 + h - y / ymax * h)

    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
              f'font-family="sans-serif" font-size="11">')]
    base = [0] * len(xs)
    for cat in data["categories"]:
        vals = series[cat]
        if not any(vals):
            continue
        top = [b + v for b, v in zip(base, vals, strict=True)]
        pts = [f"{px(x):.1f},{py(t):.1f}" for x, t in zip(xs, top, strict=True)]
        pts += [f"{px(x):.1f},{py(b):.1f}" for x, b in reversed(list(zip(xs, base, strict=True)))]
        parts.append(f'<polygon points="{" ".join(pts)}" fill="{COLORS.get(cat, "#999")}" opacity="0.85">'
                     f"<title>{html.escape(cat)}</title></polygon>")
        base = top
    for ph in data["phases"]:
        x = px(ph["seq"])
        parts.append(f'<line x1="{x:.1f}" y1="10" x2="{x:.1f}" y2="{10 + h}" stroke="#333" stroke-dasharray="3,3"/>')
        parts.append(f'<text x="{x + 3:.1f}" y="22">{html.escape(ph["phase"])}</text>')
    peak = data["peak"]
    x = px(peak["seq"])
    parts.append(f'<line x1="{x:.1f}" y1="10" x2="{x:.1f}" y2="{10 + h}" stroke="red" stroke-width="2"/>')
    parts.append(f'<text x="{x + 3:.1f}" y="{py(ymax) + 24:.1f}" fill="red">peak {ymax / GiB:.2f} GiB</text>')
    for i in range(5):
        y = ymax * i / 4
        parts.append(f'<text x="4" y="{py(y) + 4:.1f}">{y / GiB:.2f} GiB</text>')
    parts.append(f'<text x="{pad_l}" y="{height - 8}">events (allocations and frees) in step order</text>')
    parts.append("</svg>")
    return "".join(parts)


def _html(data: dict[str, Any]) -> str:
    legend = "".join(f'<span style="background:{COLORS[c]};padding:2px 6px;margin:2px;color:white">{c}</span>'
                     for c in data["categories"] if any(pt[c] for pt in data["points"]))
    rows = "".join(
        f"<tr><td style='text-align:right'>{r['bytes'] / GiB:.3f}</td><td>{html.escape(r['category'])}</td>"
        f"<td>{html.escape(r['what'] if r['category'] in _NAMED else (r['module'] or r['what']))}</td>"
        f"<td>{html.escape(r['op'])}</td></tr>"
        for r in data["top_at_peak"])
    peak = data["peak"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>vramplan timeline</title></head>"
        "<body style='font-family:sans-serif'>"
        f"<h2>Live memory over the step (peak {peak['allocated_bytes'] / GiB:.3f} GiB in {html.escape(peak['phase'])})</h2>"
        f"<div>{legend}</div>{_svg(data)}"
        "<h3>Largest blocks alive at the peak</h3><table border='1' cellspacing='0' cellpadding='3'>"
        "<tr><th>GiB</th><th>category</th><th>module</th><th>op</th></tr>"
        f"{rows}</table></body></html>\n"
    )


def _png(path: Path, data: dict[str, Any]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError("PNG timelines need matplotlib: pip install 'vramplan[plot]' "
                                "(or write .html / .json)") from None
    xs, series = _stacks(data)
    fig, (ax, tx) = plt.subplots(2, 1, figsize=(11, 7), gridspec_kw={"height_ratios": [3, 1.3]})
    cats = [c for c in data["categories"] if any(series[c])]
    ax.stackplot(xs, [[v / GiB for v in series[c]] for c in cats], labels=cats,
                 colors=[COLORS.get(c, "#999") for c in cats], alpha=0.85)
    for ph in data["phases"]:
        ax.axvline(ph["seq"], color="#333", ls="--", lw=0.8)
        ax.text(ph["seq"], ax.get_ylim()[1] * 0.97, f" {ph['phase']}", va="top", fontsize=8)
    peak = data["peak"]
    ax.axvline(peak["seq"], color="red", lw=1.5)
    ax.set_title(f"live memory by category (peak {peak['allocated_bytes'] / GiB:.2f} GiB in {peak['phase']})")
    ax.set_ylabel("GiB")
    ax.set_xlabel("events in step order")
    ax.legend(loc="upper left", fontsize=8)
    tx.axis("off")
    lines = [f"{r['bytes'] / GiB:8.3f} GiB  {r['category']:<16} "
             f"{(r['what'] if r['category'] in _NAMED else (r['module'] or r['what']))[:60]}"
             for r in data["top_at_peak"]]
    tx.text(0, 1, "largest blocks alive at the peak:\n" + "\n".join(lines), va="top", family="monospace",
            fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
