// vramplan's page: a form generated from the scenario's JSON schema, a live answer from the JSON API,
// the whole state in the URL.  Nothing is computed here beyond unit conversion for display: every number
// comes from the API's documents (the same as `vramplan ... --json`).
"use strict";

const DEBOUNCE_MS = 250;
const MAX_COMPARE = 4;
const DEFAULT_SCENARIO = {
  model: "meta-llama/Llama-3.1-8B", task: "train", hardware: { gpu: "RTX-4090" },
  train: { gradient_checkpointing: "full", peft: { method: "lora" } },
};
// The static floor (present whatever the batch) is drawn apart from the parts that grow with the batch.
const STATIC_PARTS = ["weights", "gradients", "optimizer_states", "master_weights"];
const DYNAMIC_PARTS = ["activations", "kv_cache", "temporaries", "other"];
const { GiB, gib, COLORS, baseOptions, markLine, drawPhases } = window.VramplanCharts;
// the sections read by one task only (the schema's descriptions say which), shown for that task
const TASK_SECTIONS = { train: "train", inference: "inference", serve: "serve", lifecycle: "train" };
const NARROW = window.matchMedia("(max-width: 820px)");

const state = { scenario: structuredClone(DEFAULT_SCENARIO), compare: [] };
let schema = null;
let report = null;
let planDoc = null;
const charts = {};
const inflight = {};

const $ = (sel) => document.querySelector(sel);

// ---------------------------------------------------------------- state <-> URL

function encodeState() {
  const p = new URLSearchParams();
  p.set("s", JSON.stringify(state.scenario));
  if (state.compare.length) p.set("c", JSON.stringify(state.compare));
  return "#" + p.toString();
}

function readUrl() {
  const p = new URLSearchParams(location.hash.slice(1));
  try {
    if (p.get("s")) state.scenario = JSON.parse(p.get("s"));
    if (p.get("c")) state.compare = JSON.parse(p.get("c")).slice(0, MAX_COMPARE);
  } catch (e) {
    $("#general-error").textContent = "the link's state could not be read: " + e.message;
  }
}

function writeUrl() {
  history.replaceState(null, "", encodeState());
}

function getPath(obj, path) {
  return path.split(".").reduce((o, k) => (o && typeof o === "object" ? o[k] : undefined), obj);
}

function setPath(obj, path, value) {
  const keys = path.split(".");
  let o = obj;
  for (const k of keys.slice(0, -1)) {
    if (typeof o[k] !== "object" || o[k] === null) o[k] = {};
    o = o[k];
  }
  const last = keys[keys.length - 1];
  if (value === undefined) delete o[last]; else o[last] = value;
  // drop emptied sections so the document stays as sparse as a hand-written scenario file
  if (value === undefined && keys.length > 1 && Object.keys(o).length === 0) setPath(obj, keys.slice(0, -1).join("."), undefined);
}

// ---------------------------------------------------------------- API

async function api(name, path, body, opts = {}) {
  if (inflight[name]) inflight[name].abort();
  const ctl = new AbortController();
  inflight[name] = ctl;
  const init = body === undefined ? { signal: ctl.signal }
    : { method: "POST", body: JSON.stringify(body), headers: { "Content-Type": "application/json" }, signal: ctl.signal };
  const resp = await fetch(path, init);
  if (opts.blob && resp.ok) return { ok: true, blob: await resp.blob() };
  const doc = await resp.json();
  return { ok: resp.ok, status: resp.status, doc };
}

// ---------------------------------------------------------------- the form, from the schema

function deref(prop) {
  if (prop.$ref) return schema.$defs[prop.$ref.split("/").pop()];
  return prop;
}

function kindOf(prop) {
  // -> {kind: "enum"|"int"|"number"|"bool"|"text"|"section"|"list", values, nullable}
  const variants = prop.anyOf || [prop];
  const nullable = variants.some((v) => v.type === "null");
  const main = variants.find((v) => v.type !== "null") || {};
  if (main.$ref) return { kind: "section", def: deref(main), nullable };
  if (main.enum) return { kind: "enum", values: main.enum, nullable };
  if (main.type === "array" || prop.anyOf && variants.some((v) => v.type === "array")) return { kind: "list", nullable };
  if (main.type === "integer") return { kind: "int", nullable, min: main.minimum, max: main.maximum };
  if (main.type === "number") return { kind: "number", nullable, min: main.minimum ?? main.exclusiveMinimum, max: main.maximum };
  if (main.type === "boolean") return { kind: "bool", nullable };
  return { kind: "text", nullable };
}

// a field's help: the first paragraph of its description, as `vramplan estimate --help` words it
// (cli/flags.py _first_paragraph, then the double backquotes dropped)
function helpText(prop) {
  return (prop.description || "").trim().split("\n\n")[0].split(/\s+/).filter(Boolean).join(" ").replaceAll("``", "");
}

function idFor(path) { return "f-" + path.replace(/\./g, "-"); }

function fieldEl(path, prop) {
  const k = kindOf(prop);
  const id = idFor(path);
  const wrap = document.createElement("div");
  wrap.className = "field";
  wrap.dataset.path = path;
  const label = document.createElement("label");
  label.htmlFor = id;
  label.textContent = path.split(".").pop();
  wrap.append(label);
  const dflt = prop.default === undefined ? "" : prop.default;
  let input;
  if (k.kind === "enum" || k.kind === "bool") {
    input = document.createElement("select");
    const values = k.kind === "bool" ? [true, false] : k.values;
    input.append(new Option(`default (${dflt === null ? "null" : dflt})`, ""));
    for (const v of values) input.append(new Option(String(v), JSON.stringify(v)));
  } else {
    input = document.createElement("input");
    if (k.kind === "int" || k.kind === "number") {
      input.type = "number";
      input.step = k.kind === "int" ? "1" : "any";
      input.inputMode = k.kind === "int" ? "numeric" : "decimal";
    }
    input.placeholder = dflt === null || dflt === "" ? "null" : Array.isArray(dflt) ? dflt.join(",") : String(dflt);
  }
  input.id = id;
  input.dataset.path = path;
  input.dataset.kind = k.kind;
  const help = document.createElement("small");
  help.className = "help";
  help.id = "h-" + id.slice(2);
  help.textContent = helpText(prop);
  const err = document.createElement("span");
  err.className = "error";
  err.id = "e-" + id.slice(2);
  err.setAttribute("role", "alert");
  input.setAttribute("aria-describedby", `${help.id} ${err.id}`);
  wrap.append(input, help, err);
  input.addEventListener("input", () => onField(input));
  input.addEventListener("change", () => onField(input));
  return wrap;
}

function parseField(input) {
  const raw = input.value.trim();
  if (raw === "") return undefined;
  switch (input.dataset.kind) {
    case "enum": case "bool": return JSON.parse(raw);
    case "int": case "number": { const n = Number(raw); return Number.isFinite(n) ? n : raw; }
    case "list": return raw === "all-linear" ? raw : raw.split(",").map((s) => s.trim()).filter(Boolean);
    default: return raw;
  }
}

function showField(input) {
  const v = getPath(state.scenario, input.dataset.path);
  if (v === undefined || v === null) input.value = "";
  else if (input.tagName === "SELECT") input.value = JSON.stringify(v);
  else input.value = Array.isArray(v) ? v.join(",") : String(v);
}

function peftEl(prop) {
  // train.peft is "adapters or null": a method select whose first choice is null (full fine-tuning)
  const def = deref(prop.anyOf.find((v) => v.$ref));
  const box = document.createElement("fieldset");
  box.innerHTML = "<legend>peft</legend>";
  const about = Object.assign(document.createElement("small"), { className: "help", textContent: helpText(prop) });
  box.append(about);
  const method = fieldEl("train.peft.method", { ...def.properties.method, default: null });
  method.querySelector("select").options[0].text = "none (full fine-tuning)";
  box.append(method);
  for (const [name, p] of Object.entries(def.properties)) {
    if (name !== "method") box.append(fieldEl(`train.peft.${name}`, p));
  }
  return box;
}

// a section's fields, a sub-model (serve.gguf, serve.speculative, train.peft) as a fieldset of its own fields,
// so that every leaf of the scenario is a field here as it is a flag of the CLI (cli/flags.py _leaves)
function sectionFields(box, prefix, def) {
  for (const [name, p] of Object.entries(def.properties)) {
    const path = `${prefix}.${name}`;
    const k = kindOf(p);
    if (path === "train.peft") {
      box.append(peftEl(p));
    } else if (k.kind === "section") {
      const sub = document.createElement("fieldset");
      sub.className = "sub";
      sub.dataset.path = path;
      sub.append(Object.assign(document.createElement("legend"), { textContent: name }),
        Object.assign(document.createElement("small"), { className: "help", textContent: helpText(p) }));
      sectionFields(sub, path, k.def);
      box.append(sub);
    } else {
      box.append(fieldEl(path, p));
    }
  }
}

function buildForm() {
  const top = $("#fields-top");
  const sections = $("#fields-sections");
  for (const [name, p] of Object.entries(schema.properties)) {
    if (name === "model") continue;
    if (kindOf(p).kind !== "section") { top.append(fieldEl(name, p)); continue; }
    const def = deref(p);
    if (name === "hardware") {
      for (const [hname, hp] of Object.entries(def.properties)) {
        if (hname !== "gpu") top.append(fieldEl(`hardware.${hname}`, hp));
      }
      $("#h-hardware-gpu").textContent = helpText(def.properties.gpu);
      continue;
    }
    const box = document.createElement("details");
    box.className = "section";
    box.id = "sec-" + name;
    // the task's section opens by itself on a wide screen; on a phone every section starts closed, so that
    // the answer is a short scroll below the model and GPU (one column under 820 px: style.css)
    box.open = name === (state.scenario.task || "train") && !NARROW.matches;
    const sum = document.createElement("summary");
    sum.textContent = `${name}: ${helpText(p)}`;
    box.append(sum);
    sectionFields(box, name, def);
    sections.append(box);
  }
}

function syncForm() {
  for (const input of document.querySelectorAll("#scenario [data-kind]")) showField(input);
  const m = state.scenario.model;
  $("#f-model").value = typeof m === "string" ? m : "";
  $("#f-model").placeholder = typeof m === "object" && m ? `uploaded config.json (${m._name_or_path || m.model_type || "inline"})` : "type to search the catalog, e.g. llama-3.1-8b";
  $("#clear-config").hidden = typeof m !== "object";
  $("#f-hardware-gpu").value = getPath(state.scenario, "hardware.gpu") || "";
  const task = state.scenario.task || "train";
  for (const [sec, on] of Object.entries(TASK_SECTIONS)) $("#sec-" + sec).hidden = on !== task;
  syncPeft();
}

function syncPeft() {
  // the adapter's settings show only when there is an adapter
  const peftOn = getPath(state.scenario, "train.peft") != null;
  for (const el of document.querySelectorAll('.field[data-path^="train.peft."]')) {
    if (el.dataset.path !== "train.peft.method") el.hidden = !peftOn;
  }
}

function onField(input) {
  const path = input.dataset.path;
  const v = parseField(input);
  if (path === "train.peft.method") {
    if (v === undefined) setPath(state.scenario, "train.peft", null);
    else setPath(state.scenario, "train.peft.method", v);
    if (v === undefined && Object.keys(state.scenario.train || {}).length === 1) setPath(state.scenario, "train.peft", undefined);
    syncPeft();
  } else {
    setPath(state.scenario, path, v);
  }
  if (path === "task") {
    const task = v || "train";
    for (const [sec, on] of Object.entries(TASK_SECTIONS)) { const b = $("#sec-" + sec); b.hidden = on !== task; b.open = sec === task && !NARROW.matches; }
  }
  changed();
}

// ---------------------------------------------------------------- search as you type

function searchBox(input, listId, url, key, path) {
  let timer = 0;
  input.addEventListener("input", () => {
    clearTimeout(timer);
    const q = input.value.trim();
    timer = setTimeout(async () => {
      const r = await api("search-" + listId, `${url}?q=${encodeURIComponent(q)}`).catch(() => null);
      if (!r || !r.ok) return;
      const list = document.getElementById(listId);
      list.replaceChildren(...r.doc.slice(0, 40).map((row) => new Option(row[key], row[key])));
    }, 120);
    setPath(state.scenario, path, q === "" ? undefined : q);
    changed();
  });
}

function setupUpload() {
  $("#f-config").addEventListener("change", async (ev) => {
    const file = ev.target.files[0];
    if (!file) return;
    try {
      const cfg = JSON.parse(await file.text());
      if (typeof cfg !== "object" || Array.isArray(cfg)) throw new Error("not a JSON object");
      if (!cfg._name_or_path) cfg._name_or_path = file.name.replace(/\.json$/, "");
      state.scenario.model = cfg;
      syncForm();
      changed();
    } catch (e) {
      $("#e-model").textContent = `${file.name} is not a config.json: ${e.message}`;
    }
  });
  $("#clear-config").addEventListener("click", () => {
    state.scenario.model = DEFAULT_SCENARIO.model;
    $("#f-config").value = "";
    syncForm();
    changed();
  });
}

// ---------------------------------------------------------------- errors beside the fields

function clearErrors(scope = document) {
  for (const e of scope.querySelectorAll(".error")) e.textContent = "";
  for (const i of scope.querySelectorAll('[aria-invalid="true"]')) i.removeAttribute("aria-invalid");
}

function showErrors(detail, prefix = "", fallback = "#general-error", scope = document) {
  const loose = [];
  for (const p of detail || []) {
    const where = prefix + (p.where || "");
    const field = scope.querySelector(`.field[data-path="${CSS.escape(where)}"]`);
    const text = p.text || p.message;
    if (field) {
      field.querySelector(".error").textContent = text;
      const input = field.querySelector("input, select");
      if (input) input.setAttribute("aria-invalid", "true");
    } else {
      loose.push(text);
    }
  }
  $(fallback).textContent = loose.join("\n");
}

// ---------------------------------------------------------------- charts

function chart(id, config) {
  drawChart(id, (el) => new Chart(el, config));
}

// a chart drawn by one of the shared functions (charts.js) into the canvas of that id, replacing the last
function drawChart(id, draw) {
  if (charts[id]) charts[id].destroy();
  charts[id] = draw(document.getElementById(id));
}

function detailLines(part) {
  const d = (report.per_gpu.breakdown_detail || {})[part] || {};
  return Object.entries(d).sort((a, b) => b[1] - a[1]).slice(0, 8).map(([k, v]) => `${k}: ${gib(v)} GiB`);
}

function drawBreakdown() {
  const pg = report.per_gpu;
  const parts = [...STATIC_PARTS, ...DYNAMIC_PARTS].filter((k) => pg.breakdown[k]);
  const outside = Object.keys(pg.outside_allocator).filter((k) => pg.outside_allocator[k]);
  const reservedExtra = pg.peak_reserved_bytes - pg.peak_allocated_bytes;
  const ds = parts.map((k) => ({ label: k, data: [pg.breakdown[k] / GiB], backgroundColor: COLORS[k] }));
  if (reservedExtra > 0) ds.push({ label: "reserved, not allocated", data: [reservedExtra / GiB], backgroundColor: "#d0d7de" });
  for (const k of outside) ds.push({ label: k.replace(/_/g, " "), data: [pg.outside_allocator[k] / GiB], backgroundColor: COLORS[k] });
  const xmax = Math.max(pg.capacity_bytes, pg.device_used_bytes) / GiB;
  chart("chart-breakdown", {
    type: "bar", data: { labels: ["per GPU"], datasets: ds }, plugins: [markLine],
    options: baseOptions(`Memory per GPU at the peak (${pg.peak_phase}), GiB; capacity ${gib(pg.capacity_bytes)}`, {
      indexAxis: "y",
      scales: { x: { stacked: true, max: Math.ceil(xmax), title: { display: true, text: "GiB" } }, y: { stacked: true } },
      plugins: { ...baseOptions("").plugins, title: { display: true, text: `Memory per GPU at the peak (${pg.peak_phase}), GiB; capacity ${gib(pg.capacity_bytes)}` },
        markLine: { axis: "x", value: pg.capacity_bytes / GiB, label: "capacity" },
        tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${c.parsed.x.toFixed(2)} GiB`, afterLabel: (c) => detailLines(c.dataset.label) } } },
    }),
  });
  const dyn = DYNAMIC_PARTS.filter((k) => pg.breakdown[k]);
  chart("chart-dynamic", {
    type: "bar",
    data: { labels: ["dynamic"], datasets: dyn.map((k) => ({ label: k, data: [pg.breakdown[k] / GiB], backgroundColor: COLORS[k] })) },
    options: baseOptions("The parts above the static floor (weights and states), on their own scale, GiB", {
      indexAxis: "y", scales: { x: { stacked: true }, y: { stacked: true } },
      plugins: { title: { display: true, text: "Above the static floor (weights and states), own scale, GiB" },
        legend: { position: "bottom", labels: { boxWidth: 12 } },
        tooltip: { callbacks: { label: (c) => `${c.dataset.label}: ${c.parsed.x.toFixed(3)} GiB`, afterLabel: (c) => detailLines(c.dataset.label) } } },
    }),
  });
  chart("chart-levels", {
    type: "bar",
    data: { labels: ["allocated", "reserved", "device used", "capacity"],
      datasets: [{ label: "GiB", data: [pg.peak_allocated_bytes, pg.peak_reserved_bytes, pg.device_used_bytes, pg.capacity_bytes].map((b) => b / GiB),
        backgroundColor: ["#4e79a7", "#76b7b2", pg.device_used_bytes > pg.capacity_bytes ? "#cf222e" : "#59a14f", "#bab0ac"] }] },
    options: baseOptions("Allocated vs reserved vs device used, GiB", { plugins: { title: { display: true, text: "Allocated vs reserved vs device used, GiB" }, legend: { display: false } } }),
  });
  // the step's phases (per_gpu.phases: phase -> peak allocated bytes, in the order they run)
  drawChart("chart-phases", (el) => drawPhases(el, Object.entries(pg.phases || {}).map(([phase, b]) => ({ phase, values: { allocated: b } })),
    [{ key: "allocated", label: "peak allocated" }], "The step's phases, in the order they run: peak allocated, GiB", pg.peak_phase));
}

function drawLifecycle() {
  // per_gpu.lifecycle: phase -> {allocated_bytes, reserved_bytes, device_used_bytes} at that phase's peak
  // (docs/lifecycle.md), drawn as the report gives it; lifecycle_peak_phase is marked
  const box = $("#lifecycle");
  const lc = report.per_gpu.lifecycle;
  box.replaceChildren();
  if (charts["chart-lifecycle"]) { charts["chart-lifecycle"].destroy(); delete charts["chart-lifecycle"]; }
  if (!lc || typeof lc !== "object" || !Object.keys(lc).length) return;
  const h = document.createElement("h2");
  h.textContent = "Phases of the job (GiB per GPU)";
  const t = document.createElement("table");
  const hr = t.createTHead().insertRow();
  for (const label of ["phase", "allocated", "reserved", "device used"]) {
    hr.append(Object.assign(document.createElement("th"), { textContent: label, scope: "col" }));
  }
  const body = t.createTBody();
  for (const [phase, v] of Object.entries(lc)) {
    const tr = body.insertRow();
    const peak = phase === report.per_gpu.lifecycle_peak_phase;
    tr.insertCell().textContent = peak ? `${phase} (peak)` : phase;
    for (const key of ["allocated_bytes", "reserved_bytes", "device_used_bytes"]) {
      const c = tr.insertCell();
      c.className = "num";
      c.textContent = v && typeof v[key] === "number" ? gib(v[key]) : "";
    }
    if (peak) tr.className = "peak";
  }
  const wrap = document.createElement("div");
  wrap.className = "chart-box";
  const canvas = Object.assign(document.createElement("canvas"), { id: "chart-lifecycle" });
  canvas.setAttribute("aria-label", "The job's phases, in order: allocated, reserved, device used");
  wrap.append(canvas);
  box.append(h, wrap, t);
  drawChart("chart-lifecycle", (el) => drawPhases(el, Object.entries(lc).map(([phase, values]) => ({ phase, values: values || {} })),
    [{ key: "allocated_bytes", label: "allocated" }, { key: "reserved_bytes", label: "reserved" }, { key: "device_used_bytes", label: "device used" }],
    "The job's phases, in the order they run, GiB per GPU", report.per_gpu.lifecycle_peak_phase));
}

// ---------------------------------------------------------------- the answer

function verdictOf(doc) {
  if (typeof doc.verdict === "string") return doc.verdict;
  if (!doc.fits) return "DOES NOT FIT";
  const pg = doc.per_gpu;
  return pg.headroom_bytes < 0.10 * pg.capacity_bytes ? "FITS, TIGHT" : "FITS";
}

function bands(pg) {
  // "<key>_low"/"<key>_high" pairs of the report, as given
  return Object.keys(pg).filter((k) => k.endsWith("_low") && pg[k.replace(/_low$/, "_high")] !== undefined)
    .map((k) => { const base = k.replace(/_low$/, ""); return `${base.replace(/_bytes$/, "").replace(/_/g, " ")} ${gib(pg[k])} – ${gib(pg[base + "_high"])} GiB`; });
}

// a job that is not FITS: the verified changes that make it fit and the settings taken as defaults (the
// document's remedies and assumed_settings, worded as `vramplan estimate` prints them: cli/render.py)
function drawRemedies() {
  const box = $("#remedies");
  box.replaceChildren();
  if (!report.remedies) return;
  const head = document.createElement("p");
  head.textContent = report.remedies.length ? "Would fit (each change estimated again: verdict FITS, with a 10% margin):"
    : "No single change tried makes it fit: see the plan below.";
  const ul = document.createElement("ul");
  for (const r of report.remedies) {
    ul.append(Object.assign(document.createElement("li"), { textContent: `${r.text}: ${gib(r.device_used_bytes)} of ${gib(r.capacity_bytes)} GiB` }));
  }
  box.append(head, ul);
  const assumed = Object.entries(report.assumed_settings || {});
  if (assumed.length) {
    box.append(Object.assign(document.createElement("p"), { className: "help",
      textContent: "Settings assumed (not given, defaults): " + assumed.map(([k, v]) => `${k}=${v}`).join(", ") }));
  }
}

function drawReport() {
  const pg = report.per_gpu;
  const v = verdictOf(report);
  const cls = /DOES NOT/i.test(v) ? "v-no" : /MAY NOT|TIGHT/i.test(v) ? "v-tight" : "v-fits";
  $("#verdict").innerHTML = "";
  const b = document.createElement("span");
  b.className = "badge " + cls;
  b.textContent = v;
  $("#verdict").append(b);
  // the band the verdict reads (report.band: the calibrated class, its coverage and factors, report/band.py)
  const cls0 = report.band && report.band.classes && (report.band.classes.device_used || Object.values(report.band.classes)[0]);
  if (cls0) {
    const note = Object.assign(document.createElement("span"), { className: "band", title: report.band.method,
      textContent: `${Math.round(report.band.coverage * 100)}% band ×${cls0.factor_low}–×${cls0.factor_high} (${cls0.class}, n = ${cls0.n})` });
    $("#verdict").append(" ", note);
  }
  const band = bands(pg);
  $("#summary").textContent = `${report.model.name} on ${report.scenario.hardware.num_gpus} × ${report.gpu.name} (${report.scenario.task}): `
    + `device used ${gib(pg.device_used_bytes)} of ${gib(pg.capacity_bytes)} GiB per GPU, headroom ${gib(pg.headroom_bytes)} GiB; `
    + `peak in ${pg.peak_phase}` + (band.length ? `; band: ${band.join("; ")}` : "") + ".";
  drawRemedies();
  drawBreakdown();
  drawLifecycle();
  $("#assumptions").replaceChildren(...report.assumptions.map((a) => { const li = document.createElement("li"); li.textContent = a; return li; }));
}

async function refreshEstimate() {
  // the report first (one estimate, the page's live answer), then, for a job that is not FITS, the whole
  // `estimate --json` document with its verified remedies (each one a further estimate: plan/remedies.py)
  if (inflight.remedies) inflight.remedies.abort();
  const failed = (e) => (e.name === "AbortError" ? null : { ok: false, doc: { detail: [{ where: "", text: String(e) }] } });
  const r = await api("estimate", "/api/estimate?remedies=false", state.scenario).catch(failed);
  if (!r) return;
  clearErrors($("#scenario"));
  $("#general-error").textContent = "";
  if (!r.ok) {
    showErrors(r.doc.detail);
    $("#verdict").innerHTML = '<span class="badge v-error">fix the inputs</span>';
    return;
  }
  report = r.doc;
  drawReport();
  if (verdictOf(report) === "FITS") return;
  $("#remedies").replaceChildren(Object.assign(document.createElement("p"), { className: "help", textContent: "Looking for changes that make it fit…" }));
  const full = await api("remedies", "/api/estimate", state.scenario).catch(() => null);
  if (!full || !full.ok) return;  // a newer change aborted it (refreshEstimate above)
  report = full.doc;
  drawRemedies();
}

async function refreshFit() {
  const counts = $("#fit-counts").value.trim();
  const q = new URLSearchParams();
  if (counts) q.set("counts", counts);
  // one row a GPU: the smallest count that FITS (vramplan.plan.every_gpu.smallest_fitting_counts)
  if ($("#fit-smallest").checked) q.set("smallest", "true");
  const url = "/api/fit" + (q.toString() ? "?" + q.toString() : "");
  const r = await api("fit", url, state.scenario).catch(() => null);
  const body = $("#fit-table tbody");
  clearErrors($("#fit"));
  if (r && !r.ok) showErrors(r.doc.detail, "", "#fit-summary", $("#fit"));
  if (!r || !r.ok) { body.replaceChildren(); return; }
  const only = $("#fit-only").checked;
  // the report's own verdict per GPU (FITS only when the calibrated band's high bound fits)
  const rowClass = { "FITS": "fits", "MAY NOT FIT": "tight", "DOES NOT FIT": "no", "error": "error" };
  const fitting = r.doc.filter((row) => row.verdict === "FITS");
  const maybe = r.doc.filter((row) => row.verdict === "MAY NOT FIT");
  $("#fit-summary").textContent = `Fits on ${fitting.length} of ${r.doc.length} catalog GPUs`
    + (fitting.length ? ` (the smallest: ${fitting.slice(0, 3).map((row) => ($("#fit-smallest").checked ? `${row.num_gpus} × ${row.gpu}` : row.gpu)).join("; ")})` : "")
    + (maybe.length ? `; may not fit on ${maybe.length} more (the point estimate fits, the band's high bound does not)` : "") + ".";
  body.replaceChildren(...r.doc.filter((row) => !only || row.verdict === "FITS" || row.verdict === "MAY NOT FIT").map((row) => {
    const tr = document.createElement("tr");
    tr.className = rowClass[row.verdict] || "error";
    const cells = [row.gpu, gib(row.capacity_bytes), row.num_gpus, row.verdict === "error" ? row.message : row.verdict.toLowerCase(),
      row.device_used_bytes == null ? "" : gib(row.device_used_bytes), row.headroom_bytes == null ? "" : gib(row.headroom_bytes)];
    cells.forEach((c, i) => { const td = tr.insertCell(); td.textContent = c; if ([1, 2, 4, 5].includes(i)) td.className = "num"; });
    return tr;
  }));
}

// What each serving engine's document (`vramplan serve --json`) says: its name, the start-up message, the KV
// pool's facts.  vLLM and SGLang put their decision under the engine's name; llama.cpp under "llamacpp".
const fmt = (n) => n.toLocaleString("en");
function serveView(doc) {
  // "starts": the verdict word each engine's table prints (cli/serve_cmd.py); llama.cpp's is "fits"
  if (doc.llamacpp) {
    const d = doc.llamacpp;
    return { name: "llama.cpp", d, starts: doc.fits, log: doc.log_lines, facts: [
      [`KV buffer (K ${d.cache_type_k}, V ${d.cache_type_v})`, `${gib(d.kv_bytes)} GiB`], ["n_ctx", `${fmt(d.kv_size)} tokens`],
      ["sequences", fmt(d.n_parallel)], ["largest n_ctx that fits", fmt(d.n_ctx_that_fits)],
      ["model buffer (weights)", `${gib(d.model_buffer_bytes)} GiB`], ["compute buffer", `${gib(d.compute_buffer_bytes)} GiB`],
      ["layers on the GPU", `${d.gpu_slots}/${d.n_layer + 1}`], ["device used", `${gib(d.device_used_bytes)} GiB`]] };
  }
  const d = doc[doc.engine];
  if (doc.engine === "sglang") {
    return { name: `SGLang ${d.sglang_version}`, d, starts: d.starts, facts: [
      ["KV pool", `${gib(d.kv_cache_bytes)} GiB`], ["max_total_num_tokens", `${fmt(d.max_total_num_tokens)} tokens`],
      ["pages", `${fmt(d.num_pages)} of ${fmt(d.page_size)} tokens`], ["max_running_requests", fmt(d.max_running_requests)],
      [`max concurrency at ${fmt(d.context_len)} tokens`, `${d.max_concurrency}×`],
      ["static budget", `${gib(d.static_budget_bytes)} GiB (${d.mem_fraction_static} × free at start)`],
      ["device used", `${gib(d.device_used_bytes)} GiB`]] };
  }
  return { name: `vLLM ${d.vllm_version_modelled}`, d, starts: d.starts, facts: [
    ["KV cache", `${gib(d.kv_cache_bytes)} GiB`], ["GPU blocks", fmt(d.num_gpu_blocks)],
    ["KV cache size", `${fmt(d.kv_cache_tokens)} tokens`],
    [`max concurrency at ${fmt(d.max_model_len)} tokens`, `${d.max_concurrency}×`],
    ["largest max_model_len that fits", fmt(d.max_model_len_that_fits)],
    ["KV bytes per token", fmt(d.kv_bytes_per_token)], ["device used", `${gib(d.device_used_bytes)} GiB`]] };
}

async function refreshServe() {
  const box = $("#serving");
  box.hidden = (state.scenario.task || "train") !== "serve";
  if (box.hidden) return;
  const [r, c] = await Promise.all([api("serve", "/api/serve", state.scenario).catch(() => null),
    api("curve", "/api/serve/curve", state.scenario).catch(() => null)]);
  if (!r) return;
  const msg = $("#serve-message");
  if (!r.ok) {
    // the serving engine's own refusal (the estimate's errors are shown beside the fields)
    msg.textContent = r.doc.detail.map((p) => p.text || p.message).join("\n");
    msg.className = "error";
    $("#serve-facts").replaceChildren();
    $("#serve-log").hidden = true;
    return;
  }
  const v = serveView(r.doc);
  msg.textContent = v.starts ? `${v.name} starts.`
    : `${v.name} will not start: ${v.d.problem || "device used is over the capacity"}` + (v.d.fix ? ` (change ${v.d.fix})` : "");
  msg.className = v.starts ? "" : "error";
  $("#serve-facts").replaceChildren(...v.facts.flatMap(([k, val]) => { const dt = document.createElement("dt"); dt.textContent = k; const dd = document.createElement("dd"); dd.textContent = val; return [dt, dd]; }));
  $("#serve-log").hidden = !v.log;
  $("#serve-log pre").textContent = (v.log || []).join("\n");
  const curveBox = $("#chart-curve").parentElement;
  curveBox.hidden = !(c && c.ok);
  $("#curve-note").textContent = c && !c.ok ? c.doc.detail.map((p) => p.text || p.message).join("\n") : "";
  if (c && c.ok) {
    chart("chart-curve", {
      type: "line",
      data: { labels: c.doc.map((p) => p.context_len.toLocaleString("en")), datasets: [{ label: "requests at once", data: c.doc.map((p) => p.max_concurrency), borderColor: "#4e79a7" }] },
      options: baseOptions("Concurrency against context length (vLLM's maximum concurrency)", {
        scales: { x: { title: { display: true, text: "tokens per request" } }, y: { type: "logarithmic", title: { display: true, text: "requests" } } },
        plugins: { title: { display: true, text: "Concurrency against context length (vLLM's maximum concurrency)" }, legend: { display: false } } }),
    });
  }
}

async function refreshGenerate() {
  const box = $("#generate-facts");
  box.hidden = state.scenario.task !== "inference";
  if (box.hidden) return;
  const r = await api("generate", "/api/generate", state.scenario).catch(() => null);
  if (!r || !r.ok) { box.textContent = ""; return; }
  const inf = r.doc.report.scenario.inference;
  box.textContent = `Largest batch that fits at ${inf.prompt_len.toLocaleString("en")} + ${inf.new_tokens.toLocaleString("en")} tokens: `
    + `${r.doc.max_batch_size.toLocaleString("en")}; longest prompt at batch ${inf.batch_size} and ${inf.new_tokens.toLocaleString("en")} new tokens: `
    + `${r.doc.max_prompt_len.toLocaleString("en")}.`;
}

let timer = 0;
function changed() {
  writeUrl();
  clearTimeout(timer);
  timer = setTimeout(() => { refreshEstimate(); refreshFit(); refreshServe(); refreshGenerate(); }, DEBOUNCE_MS);
}

// ---------------------------------------------------------------- compare

const COMPARE_ROWS = [
  ["model", (r) => r.model.name, "model.name"], ["GPU", (r) => `${r.scenario.hardware.num_gpus} × ${r.gpu.name}`, "gpu.name"],
  ["task", (r) => r.scenario.task, "scenario.task"], ["verdict", verdictOf, "fits"],
  ["device used GiB", (r) => gib(r.per_gpu.device_used_bytes), "per_gpu.device_used_bytes"],
  ["headroom GiB", (r) => gib(r.per_gpu.headroom_bytes), "per_gpu.headroom_bytes"],
  ["reserved GiB", (r) => gib(r.per_gpu.peak_reserved_bytes), "per_gpu.peak_reserved_bytes"],
  ["allocated GiB", (r) => gib(r.per_gpu.peak_allocated_bytes), "per_gpu.peak_allocated_bytes"],
  ...[...STATIC_PARTS, ...DYNAMIC_PARTS].map((k) => [`${k} GiB`, (r) => gib(r.per_gpu.breakdown[k]), `per_gpu.breakdown.${k}`]),
];

async function refreshCompare() {
  const table = $("#compare-table");
  $("#compare-empty").hidden = state.compare.length > 0;
  $("#add-compare").disabled = state.compare.length >= MAX_COMPARE;
  if (state.compare.length < 2) {
    // compare takes two to four setups (vramplan.compare.MIN_SETUPS)
    table.replaceChildren();
    $("#compare-empty").hidden = false;
    if (state.compare.length === 1) $("#compare-empty").textContent = "Setup 1 added: change the form and add a second setup to compare.";
    return;
  }
  const r = await api("compare", "/api/compare", state.compare).catch(() => null);
  if (!r) return;
  if (!r.ok) { table.replaceChildren(); $("#compare-empty").hidden = false; $("#compare-empty").textContent = r.doc.detail.map((p) => p.text).join("\n"); return; }
  const diff = new Set(r.doc.differing_keys);
  table.replaceChildren();
  const head = table.createTHead();
  const hr = head.insertRow();
  hr.append(Object.assign(document.createElement("th"), { textContent: "" }));
  r.doc.reports.forEach((_, i) => {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = `setup ${i + 1} `;
    const rm = Object.assign(document.createElement("button"), { type: "button", textContent: "remove" });
    rm.setAttribute("aria-label", `remove setup ${i + 1}`);
    rm.addEventListener("click", () => { state.compare.splice(i, 1); writeUrl(); refreshCompare(); });
    th.append(rm);
    hr.append(th);
  });
  const body = table.createTBody();
  for (const [label, fn, key] of COMPARE_ROWS) {
    const tr = body.insertRow();
    tr.append(Object.assign(document.createElement("th"), { textContent: label, scope: "row" }));
    for (const rep of r.doc.reports) {
      const td = tr.insertCell();
      td.textContent = fn(rep);
      if (diff.has(key)) td.className = "diff";
    }
  }
  const tr = body.insertRow();
  tr.append(Object.assign(document.createElement("th"), { textContent: "keys that differ", scope: "row" }));
  const td = tr.insertCell();
  td.colSpan = r.doc.reports.length;
  td.textContent = r.doc.differing_keys.filter((k) => k.startsWith("scenario.")).join(", ") || "(no scenario key differs)";
}

// ---------------------------------------------------------------- plan

function planBody() {
  const sc = state.scenario;
  const task = sc.task === "serve" ? "serve" : "train";
  const body = { model: sc.model, gpu: getPath(sc, "hardware.gpu") || "", num_gpus: $("#p-num_gpus").value.trim() || "1", task,
    peft: $("#p-peft").value, margin: Number($("#p-margin").value || 0.1) };
  if (task === "train") {
    body.seq_len = getPath(sc, "train.seq_len") || schema.$defs.Train.properties.seq_len.default;
    const gb = $("#p-global_batch").value.trim();
    if (gb) body.global_batch = Number(gb);
  } else {
    body.max_model_len = getPath(sc, "serve.max_model_len") || 8192;
    body.concurrency = Number($("#p-concurrency").value || 1);
  }
  return body;
}

function planTable(doc) {
  const t = document.createElement("table");
  const h = t.createTHead().insertRow();
  for (const c of ["#", "setup", "GPUs", "step s", "tokens/s", "GiB/GPU", "headroom GiB", "trades"]) h.append(Object.assign(document.createElement("th"), { textContent: c, scope: "col" }));
  const b = t.createTBody();
  for (const r of [doc.chosen, ...doc.runners_up].filter(Boolean)) {
    const tr = b.insertRow();
    [r.rank, r.label, r.setup.num_gpus, r.step_time_s.toFixed(3), Math.round(r.tokens_per_s).toLocaleString("en"), gib(r.device_used_bytes), gib(r.headroom_bytes), r.trade || "chosen"]
      .forEach((v, i) => { const td = tr.insertCell(); td.textContent = v; if (i !== 1 && i !== 7) td.className = "num"; });
  }
  return t;
}

async function runPlan(ev) {
  ev.preventDefault();
  const out = $("#plan-out");
  clearErrors($("#plan"));
  out.textContent = "planning…";
  planDoc = null;
  $("#download-zip").disabled = true;
  const r = await api("plan", "/api/plan", planBody()).catch((e) => ({ ok: false, doc: { detail: [{ text: String(e) }] } }));
  out.replaceChildren();
  if (!r.ok) { showErrors(r.doc.detail, "", "#plan-error", $("#plan")); return; }
  planDoc = r.doc;
  const v = document.createElement("p");
  v.innerHTML = `<span class="badge ${r.doc.chosen ? "v-fits" : "v-no"}"></span>`;
  v.firstChild.textContent = r.doc.chosen ? "FITS" : "NOTHING FITS";
  const ul = document.createElement("ul");
  for (const line of [...r.doc.explanation, ...r.doc.suggestions.map((s) => "would fit: " + s.text), ...r.doc.notes.map((n) => "note: " + n)]) {
    ul.append(Object.assign(document.createElement("li"), { textContent: line }));
  }
  out.append(v, ul, planTable(r.doc));
  $("#download-zip").disabled = !r.doc.chosen;
}

async function downloadZip() {
  const r = await api("zip", "/api/plan/export.zip", planBody(), { blob: true }).catch(() => null);
  if (!r || !r.ok) { $("#plan-error").textContent = r && r.doc ? r.doc.detail.map((p) => p.text).join("\n") : "download failed"; return; }
  const a = document.createElement("a");
  a.href = URL.createObjectURL(r.blob);
  a.download = "vramplan-export.zip";
  document.body.append(a);
  a.click();
  a.remove();
}

// ---------------------------------------------------------------- start

async function main() {
  readUrl();
  if (!location.hash) writeUrl();
  // the search boxes listen from the first moment (typing before the schema has arrived is not lost)
  searchBox($("#f-model"), "models-list", "/api/models", "id", "model");
  searchBox($("#f-hardware-gpu"), "gpus-list", "/api/gpus", "name", "hardware.gpu");
  const health = await api("health", "/healthz").catch(() => null);
  if (health && health.ok && health.doc.hub) {
    $("#h-model").textContent = "Catalog id or alias, a Hugging Face Hub id (owner/name: this server reads its config.json), or upload a config.json below.";
  }
  const r = await api("schema", "/api/schema");
  schema = r.doc;
  buildForm();
  syncForm();
  setupUpload();
  $("#fit-only").addEventListener("change", refreshFit);
  $("#fit-smallest").addEventListener("change", refreshFit);
  let fitTimer = 0;
  $("#fit-counts").addEventListener("input", () => { clearTimeout(fitTimer); fitTimer = setTimeout(refreshFit, DEBOUNCE_MS); });
  $("#share").addEventListener("click", async () => {
    writeUrl();
    try { await navigator.clipboard.writeText(location.href); $("#share").textContent = "Link copied"; } catch { $("#share").textContent = "Link is in the address bar"; }
  });
  $("#add-compare").addEventListener("click", () => {
    if (state.compare.length >= MAX_COMPARE) return;
    state.compare.push(structuredClone(state.scenario));
    writeUrl();
    refreshCompare();
  });
  $("#to-answer").addEventListener("click", () => $("#answer").scrollIntoView());
  $("#plan-form").addEventListener("submit", runPlan);
  $("#download-zip").addEventListener("click", downloadZip);
  window.addEventListener("hashchange", () => { readUrl(); syncForm(); changed(); refreshCompare(); });
  refreshCompare();
  changed();
}

document.addEventListener("DOMContentLoaded", main);
