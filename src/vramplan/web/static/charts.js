// vramplan's charts, shared by the page (index.html loads this file) and by the self-contained timeline
// HTML that `vramplan trace --timeline FILE.html` writes (vramplan/trace/timeline.py inlines this file and
// the vendored Chart.js into it).  One copy: both draw with these functions.  Nothing is computed here
// beyond unit conversion for display; every number comes from the documents the library writes.
"use strict";

(function (root) {
  const GiB = 2 ** 30;
  const gib = (n) => (n / GiB).toLocaleString("en", { minimumFractionDigits: 1, maximumFractionDigits: 2 });
  // a size with its unit: MiB below a GiB, so that the small blocks of a small model do not read as 0.0
  const size = (n) => (Math.abs(n) >= GiB ? `${gib(n)} GiB` : `${(n / 2 ** 20).toLocaleString("en", { maximumFractionDigits: 1 })} MiB`);
  const COLORS = {
    weights: "#4e79a7", gradients: "#f28e2b", optimizer_states: "#e15759", master_weights: "#76b7b2",
    activations: "#59a14f", kv_cache: "#edc948", temporaries: "#b07aa1", other: "#ff9da7",
    cuda_context: "#9c755f", workspaces: "#bab0ac", communication: "#8cd17d", managed: "#d4a6c8",
  };

  const baseOptions = (title, extra = {}) => ({
    responsive: true, maintainAspectRatio: false, animation: false,
    plugins: { title: { display: true, text: title }, legend: { position: "bottom", labels: { boxWidth: 12 } } },
    ...extra,
  });

  // A labelled line across the chart at one value of an axis (the GPU's capacity on the breakdown, the
  // peak on a timeline).  Options: {axis: "x"|"y", value, label, color}.
  const markLine = {
    id: "markLine",
    afterDatasetsDraw(c, _args, opts) {
      if (opts.value === undefined || opts.value === null) return;
      const axis = opts.axis || "x";
      const pos = c.scales[axis].getPixelForValue(opts.value);
      const { top, bottom, left, right } = c.chartArea;
      const ctx = c.ctx;
      ctx.save();
      ctx.strokeStyle = opts.color || "#cf222e";
      ctx.fillStyle = opts.color || "#cf222e";
      ctx.lineWidth = 2;
      ctx.setLineDash([6, 3]);
      ctx.beginPath();
      if (axis === "x") { ctx.moveTo(pos, top - 4); ctx.lineTo(pos, bottom + 4); } else { ctx.moveTo(left, pos); ctx.lineTo(right, pos); }
      ctx.stroke();
      if (opts.label) {
        // the label stays inside the chart area, whichever side of the line has room (never clipped)
        ctx.textAlign = axis === "x" && pos > right - 120 ? "right" : "left";
        const x = axis === "x" ? pos + (ctx.textAlign === "right" ? -4 : 4) : left + 4;
        ctx.fillText(opts.label, x, axis === "x" ? top + 10 : pos - 4);
      }
      ctx.restore();
    },
  };

  // The phase a step-order position falls in: the last mark at or before it (marks are {seq, phase}).
  function phaseAt(marks, seq) {
    let name = marks.length ? "before " + marks[0].phase : "";
    for (const m of marks) { if (m.seq <= seq) name = m.phase; else break; }
    return name;
  }

  // The step's timeline (vramplan.trace.timeline.timeline's document): live bytes by category, stacked,
  // over the step; the x axis is labelled with the step's phases at the positions they start (not event
  // numbers), the peak is marked, and hovering a band lists the largest blocks of that category alive at
  // the peak (the document's top_at_peak).
  function drawTimeline(canvas, data) {
    const marks = [...data.phases].sort((a, b) => a.seq - b.seq);
    const cats = data.categories.filter((c) => data.points.some((p) => p[c]));
    const xs = data.points.map((p) => p.seq);
    const datasets = cats.map((c) => ({
      label: c, data: data.points.map((p) => ({ x: p.seq, y: p[c] / GiB })), fill: true, stepped: true,
      backgroundColor: COLORS[c] || "#999", borderColor: COLORS[c] || "#999", borderWidth: 0.5, pointRadius: 0,
    }));
    const peak = data.peak;
    const topOf = (cat) => data.top_at_peak.filter((r) => r.category === cat).slice(0, 6)
      .map((r) => `  ${size(r.bytes)}  ${r.module || r.what}${r.op && r.op !== (r.module || r.what) ? " (" + r.op + ")" : ""}`);
    return new Chart(canvas, {
      type: "line", data: { datasets }, plugins: [markLine],
      options: baseOptions(`Live memory over the step, GiB (peak ${size(peak.allocated_bytes)} in ${peak.phase})`, {
        interaction: { mode: "nearest", axis: "x", intersect: false },
        scales: {
          x: {
            type: "linear", min: Math.min(...xs), max: Math.max(...xs),
            title: { display: true, text: "the step's phases, in the order they run" },
            afterBuildTicks: (axis) => { axis.ticks = marks.map((m) => ({ value: m.seq })); },
            ticks: { autoSkip: false, maxRotation: 60, callback: (v) => (marks.find((m) => m.seq === v) || {}).phase ?? "" },
          },
          y: { stacked: true, beginAtZero: true, title: { display: true, text: "GiB" } },
        },
        plugins: {
          title: { display: true, text: `Live memory over the step, GiB (peak ${size(peak.allocated_bytes)} in ${peak.phase})` },
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          markLine: { axis: "x", value: peak.seq, label: `peak ${size(peak.allocated_bytes)}` },
          tooltip: { callbacks: {
            title: (items) => (items.length ? phaseAt(marks, items[0].parsed.x) : ""),
            label: (c) => `${c.dataset.label}: ${c.parsed.y.toFixed(3)} GiB`,
            afterLabel: (c) => { const t = topOf(c.dataset.label); return t.length ? ["largest alive at the peak:", ...t] : []; },
          } },
        },
      }),
    });
  }

  // Phases on an axis of their own, in the order they run, labelled: rows [{phase, values: {series: bytes}}]
  // (per_gpu.phases: the step's; per_gpu.lifecycle: the job's), the peak phase marked.
  function drawPhases(canvas, rows, series, title, peakPhase) {
    const palette = ["#4e79a7", "#76b7b2", "#59a14f", "#f28e2b"];
    const datasets = series.map((s, i) => ({
      label: s.label, data: rows.map((r) => (typeof r.values[s.key] === "number" ? r.values[s.key] / GiB : null)),
      borderColor: palette[i % palette.length], backgroundColor: palette[i % palette.length], pointRadius: 4, tension: 0,
    }));
    return new Chart(canvas, {
      type: "line", data: { labels: rows.map((r) => r.phase), datasets }, plugins: [markLine],
      options: baseOptions(title, {
        scales: { x: { title: { display: true, text: "phases, in the order they run" }, ticks: { autoSkip: false } },
          y: { beginAtZero: true, title: { display: true, text: "GiB" } } },
        plugins: { title: { display: true, text: title }, legend: { position: "bottom", labels: { boxWidth: 12 } },
          markLine: rows.some((r) => r.phase === peakPhase) ? { axis: "x", value: rows.findIndex((r) => r.phase === peakPhase), label: "peak" } : {},
          tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${c.parsed.y.toFixed(2)} GiB` } } },
      }),
    });
  }

  // A memory snapshot's allocator trace (vramplan.measure.snapshot.write_timeline_plot's document): live
  // (requested) and reserved bytes after each trace entry, the out-of-memory entry marked.  A snapshot
  // carries no phases, so the axis is the trace's own entry numbers.
  function drawSnapshot(canvas, data) {
    const MiB = 2 ** 20;
    const line = (label, key, color) => ({ label, data: data.points.map((p) => ({ x: p.entry, y: p[key] / MiB })),
      borderColor: color, backgroundColor: color, pointRadius: 0, borderWidth: 1.5, stepped: true });
    const oom = data.oom;
    return new Chart(canvas, {
      type: "line", plugins: [markLine],
      data: { datasets: [line("reserved", "reserved_bytes", "#999999"), line("live tensors (requested)", "live_bytes", "#1f77b4")] },
      options: baseOptions(data.title, {
        interaction: { mode: "nearest", axis: "x", intersect: false },
        scales: { x: { type: "linear", title: { display: true, text: "trace entry" } },
          y: { beginAtZero: true, title: { display: true, text: "MiB" } } },
        plugins: { title: { display: true, text: data.title }, legend: { position: "bottom", labels: { boxWidth: 12 } },
          markLine: oom ? { axis: "x", value: oom.trace_index, label: `OOM: ${(oom.request_bytes / MiB).toFixed(1)} MiB requested` } : {},
          tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${c.parsed.y.toFixed(1)} MiB` } } },
      }),
    });
  }

  root.VramplanCharts = { GiB, gib, size, COLORS, baseOptions, markLine, phaseAt, drawTimeline, drawPhases, drawSnapshot };
})(typeof window !== "undefined" ? window : globalThis);
