"""The step's timeline (and a snapshot's plot) as a self-contained HTML file: the page's chart code and the vendored Chart.js
inlined, the data embedded, nothing fetched; opened from disk (a file:// URL) in Debian's Chromium.

The data is a hand-written document of the shape ``vramplan.trace.timeline.timeline`` returns, so the
test needs neither torch nor the ``web`` extra (``write_timeline`` must not need FastAPI).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from vramplan.report import BREAKDOWN_KEYS
from vramplan.trace.timeline import write_timeline

MiB = 2**20


def _data() -> dict[str, Any]:
    zero = dict.fromkeys(BREAKDOWN_KEYS, 0)
    # weights 8 MiB all along; activations grow over the forward pass to 6 MiB and are freed in the
    # backward pass; gradients appear in the backward pass; the peak is at seq 40: 8 + 4 + 2 = 14 MiB
    rows = [(0, 0, 0), (10, 2, 0), (20, 6, 0), (30, 6, 1), (40, 4, 2), (50, 0, 2), (60, 0, 2)]
    points = [{"seq": s, **zero, "weights": 8 * MiB, "activations": a * MiB, "gradients": g * MiB} for s, a, g in rows]
    return {
        "unit": "bytes", "categories": list(BREAKDOWN_KEYS), "points": points,
        "phases": [{"seq": 5, "phase": "forward"}, {"seq": 25, "phase": "backward"},
                   {"seq": 55, "phase": "optimizer"}, {"seq": 60, "phase": "end"}],
        "peak": {"seq": 30, "allocated_bytes": 15 * MiB, "phase": "backward",
                 "breakdown": {**zero, "weights": 8 * MiB, "activations": 6 * MiB, "gradients": MiB}},
        "top_at_peak": [{"bytes": 8 * MiB, "category": "weights", "module": "", "op": "model.embed.weight",
                         "what": "model.embed.weight"},
                        {"bytes": 4 * MiB, "category": "activations", "module": "model.layers.0.mlp",
                         "op": "aten::mm", "what": "model.layers.0.mlp </script> aten::mm"}],
    }


def test_timeline_html_is_self_contained(tmp_path: Path) -> None:
    data = _data()
    text = write_timeline(tmp_path / "t.html", data).read_text(encoding="utf-8")
    # nothing is fetched: no script, stylesheet, image or link that names a network address
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.IGNORECASE)
    assert "<script src" not in text and "<link" not in text
    # the page's shared chart code and Chart.js are inlined
    assert "VramplanCharts" in text and "drawTimeline" in text and "Chart.js v4" in text
    # the data is embedded, whole, and a "</script>" inside a name cannot end its element early
    m = re.search(r"<script type='application/json' id='chart-data'>(.*?)</script>", text, re.DOTALL)
    assert m is not None and json.loads(m.group(1)) == data
    assert text.count("</script>") == 4  # Chart.js, charts.js, the data, the call that draws


def test_timeline_writer_does_not_import_fastapi() -> None:
    code = ("import sys, vramplan, vramplan.trace.timeline as t, tempfile, os;"
            "t._static('charts.js'); print('fastapi' in sys.modules, 'vramplan.web' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_timeline_html_draws_offline_from_disk(tmp_path: Path, browser: Any) -> None:
    path = write_timeline(tmp_path / "step.html", _data())
    ctx = browser.new_context(viewport={"width": 1100, "height": 800})
    requests: list[str] = []
    ctx.route("**/*", lambda route: (requests.append(route.request.url),
                                     route.continue_() if route.request.url.startswith("file://") else route.abort()))
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(path.resolve().as_uri())
    page.wait_for_function("() => window.Chart && Chart.getChart('chart')")
    chart = page.evaluate("""() => { const c = Chart.getChart('chart');
        return { ticks: c.scales.x.ticks.map((t) => t.label), labels: c.data.datasets.map((d) => d.label),
                 title: c.options.plugins.title.text, peak: c.options.plugins.markLine.value,
                 tip: c.options.plugins.tooltip.callbacks.afterLabel({ dataset: { label: 'activations' } }) }; }""")
    # the x axis is the step's phases at the positions they start, not event numbers
    assert chart["ticks"] == ["forward", "backward", "optimizer", "end"]
    assert chart["labels"] == ["weights", "gradients", "activations"]  # the categories that are ever non-zero
    assert chart["peak"] == 30 and "in backward" in chart["title"]  # the peak marked where it is
    # hovering the activations band names the largest activation block alive at the peak
    assert any("model.layers.0.mlp" in line for line in chart["tip"])
    assert chart["tip"][1].startswith("  4 MiB")  # a block under a GiB in MiB, not "0.0 GiB"
    # something is drawn on the canvas (not a blank one)
    painted = page.evaluate("""() => { const c = document.getElementById('chart');
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i]) n++; return n; }""")
    assert painted > 1000
    page.screenshot(path=str(Path(__file__).resolve().parents[1] / "test-artifacts" / "timeline-from-disk.png"))
    ctx.close()
    assert errors == []
    assert all(u.startswith("file://") for u in requests), requests


def test_snapshot_plot_draws_offline_from_disk(tmp_path: Path, browser: Any) -> None:
    from vramplan.measure.snapshot import read_snapshot, write_timeline_plot

    report = read_snapshot(Path(__file__).resolve().parent / "data" / "snapshots" / "oom_small.pickle")
    path = write_timeline_plot(report, tmp_path / "snap.html")
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(path.resolve().as_uri())
    page.wait_for_function("() => window.Chart && Chart.getChart('chart')")
    got = page.evaluate("""() => { const c = Chart.getChart('chart');
        return { mark: c.options.plugins.markLine, n: c.data.datasets.map((d) => d.data.length) }; }""")
    assert report.oom is not None and got["mark"]["value"] == report.oom.trace_index
    assert got["mark"]["label"] == "OOM: 40.0 MiB requested"  # the snapshot's 40 MiB request (test_snapshot.py)
    assert got["n"] == [len(report.timeline)] * 2  # a small trace: every point, live and reserved
    page.close()
    assert errors == []
