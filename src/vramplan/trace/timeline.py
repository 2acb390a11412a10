"""The step's timeline: live bytes over the step by category, the peak, and what is alive then.

``timeline(events, marks)`` returns plain data (JSON-ready); ``write_timeline(path, data)``
writes it as ``.json``, ``.html`` or ``.png`` (matplotlib, from the ``plot`` extra).  The ``.html``
file is the page's own chart (``vramplan/web/static/charts.js``, ``drawTimeline``) with the vendored
Chart.js and the data inlined: it opens from disk, offline, with no server and without the ``web``
extra (the files are package data, read with importlib.resources).  Sizes are rounded to 512 bytes per block, as
``torch.cuda.memory_allocated`` counts them, so the peak matches the report's
``peak_allocated_bytes``.
"""

from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

from vramplan.errors import MissingExtraError, Problem, ScenarioError
from vramplan.report import BREAKDOWN_KEYS
from vramplan.trace.report import label, peak_of, rounded
from vramplan.trace.tracker import TrackEvent
from vramplan.units import GiB

__all__ = ["chart_page", "timeline", "write_timeline"]

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


# The page's static files, read as package data without importing vramplan.web (which needs FastAPI).
_STATIC = ("web", "static")


def _static(*parts: str) -> str:
    node = resources.files("vramplan")
    for part in (*_STATIC, *parts):
        node = node / part
    return node.read_text(encoding="utf-8")


def _inline_script(text: str) -> str:
    # inside <script>, "</script" ends the element whatever the JavaScript around it (HTML spec, script
    # data state); "<\/script" is the same text inside a JavaScript string or regular expression
    return re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE)


def _inline_json(data: dict[str, Any]) -> str:
    # "<" occurs in JSON only inside strings, where "\u003c" is the same character: the data cannot end
    # the <script> element it is embedded in
    return json.dumps(data, separators=(",", ":")).replace("<", "\\u003c")


def chart_page(title: str, data: dict[str, Any], draw: str, before: str = "", after: str = "") -> str:
    """A self-contained HTML page that draws ``data`` with ``VramplanCharts.<draw>`` (charts.js).

    Chart.js (vendored) and charts.js are inlined, the data embedded as JSON: the file opens from disk,
    offline.  ``before``/``after``: HTML (already escaped) above and below the chart."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:1rem}.chart{position:relative;height:420px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}.num{text-align:right}</style>"
        f"<script>{_inline_script(_static('vendor', 'chart.umd.min.js'))}</script>"
        f"<script>{_inline_script(_static('charts.js'))}</script></head><body>{before}"
        f"<div class='chart'><canvas id='chart' aria-label='{html.escape(title)}'></canvas></div>{after}"
        f"<script type='application/json' id='chart-data'>{_inline_json(data)}</script>"
        f"<script>VramplanCharts.{draw}(document.getElementById('chart'), "
        "JSON.parse(document.getElementById('chart-data').textContent));</script>"
        "</body></html>\n"
    )


def _html(data: dict[str, Any]) -> str:
    rows = "".join(
        f"<tr><td class='num'>{r['bytes'] / GiB:.3f}</td><td>{html.escape(r['category'])}</td>"
        f"<td>{html.escape(r['what'] if r['category'] in _NAMED else (r['module'] or r['what']))}</td>"
        f"<td>{html.escape(r['op'])}</td></tr>"
        for r in data["top_at_peak"])
    peak = data["peak"]
    heading = (f"<h2>Live memory over the step (peak {peak['allocated_bytes'] / GiB:.3f} GiB in "
               f"{html.escape(peak['phase'])})</h2>")
    table = ("<h3>Largest blocks alive at the peak</h3><table>"
             f"<tr><th>GiB</th><th>category</th><th>module</th><th>op</th></tr>{rows}</table>")
    return chart_page("vramplan timeline", data, "drawTimeline", heading, table)


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
