"""The page in a real browser: Debian's Chromium driven by Playwright for Python.

A uvicorn server (``vramplan web``) runs on a free localhost port for the module; each test opens the
page, acts as a user would (pick a model and a GPU, break a field, compare, plan, download, reload a
shared link) and reads what the page shows.  Screenshots go to ``test-artifacts/`` (git-ignored).
Playwright's own browser download is not used: the system Chromium is launched by path.  The tests
skip, saying why, only when that Chromium (or the Python packages) is absent; ``.ci/run`` installs it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("VRAMPLAN_CHROMIUM", "/usr/bin/chromium")

if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)", allow_module_level=True)
playwright_sync = pytest.importorskip("playwright.sync_api", reason="needs playwright (the dev extra)")
pytest.importorskip("fastapi", reason="needs the web extra (fastapi, uvicorn)")
pytest.importorskip("uvicorn", reason="needs the web extra (fastapi, uvicorn)")

# generous: the waits below return as soon as the page shows what they wait for, so a long limit costs
# nothing when the machine is idle and keeps the tests steady when two cores are shared by many jobs
TIMEOUT_MS = 30_000
# /api/compare runs one estimate per setup on the server; on a cold two-core machine that is still
# importing and caching model configs, two or four setups can take longer than one page answer
COMPARE_TIMEOUT_MS = 90_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _web_server(*args: str) -> Iterator[str]:
    """``vramplan web ARGS`` on a free localhost port, with this process's environment; its address."""
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "vramplan.cli.main", "web", "--port", str(port), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stdout.read().decode() if proc.stdout else "server exited") from None
                time.sleep(0.1)
        else:
            raise RuntimeError("the server did not answer /healthz in 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with _web_server() as url:
        yield url


def _offline_context(browser: Any, outside: list[str], local: list[str] | None = None, **kwargs: Any) -> Any:
    """A browser context with the network cut off: every request that leaves the local server is aborted
    and recorded in ``outside`` (and every local one in ``local``)."""
    ctx = browser.new_context(**kwargs)

    def handle(route: Any) -> None:
        if route.request.url.startswith("http://127.0.0.1"):
            if local is not None:
                local.append(route.request.url)
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort("internetdisconnected")

    ctx.route("**/*", handle)
    return ctx


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    # every test's page has the network cut off: a request that leaves localhost fails the test
    outside: list[str] = []
    ctx = _offline_context(browser, outside, viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    ctx.close()
    assert outside == []


def _verdict(page: Any) -> str:
    return str(page.locator("#verdict .badge").inner_text())


# the opening setup's verdict: Llama-3.1-8B LoRA on an RTX 4090 uses 20.2 of 23.64 GiB, so the point
# estimate fits while the calibrated band's high bound (about x1.26, report/band.py) does not
OPENING = "MAY NOT FIT"


def _wait_verdict(page: Any, text: str) -> None:
    page.wait_for_function("t => document.querySelector('#verdict .badge')?.textContent === t", arg=text)


def _weights(page: Any) -> float:
    return float(page.evaluate(
        "Chart.getChart('chart-breakdown').data.datasets.find(d => d.label === 'weights').data[0]"))


def _fill(page: Any, selector: str, value: str) -> None:
    page.locator(selector).fill(value)


def test_readme_question_and_live_answer(page: Any, server: str) -> None:
    """Llama-3.1-8B LoRA on an RTX 4090 (the page's opening setup), then a bigger model, then another GPU."""
    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    assert "Llama-3.1-8B" in page.locator("#summary").inner_text()
    # the job's phases (per_gpu.lifecycle) as a table of GiB, the peak's phase marked, no raw JSON
    phases = page.locator("#lifecycle").inner_text()
    assert "training step" in phases and "load" in phases and "(peak)" in phases and "{" not in phases
    page.wait_for_selector("#fit-table tbody tr.fits")
    fit_rows = page.locator("#fit-table tbody tr").count()
    assert fit_rows >= 50  # every catalog GPU has a row
    page.screenshot(path=str(ARTIFACTS / "web-llama-3.1-8b-lora-rtx4090.png"), full_page=True)
    page.locator("#fit-counts").fill("1,2")
    page.wait_for_function(f"() => document.querySelectorAll('#fit-table tbody tr').length === {2 * fit_rows}")
    page.locator("#fit-counts").fill("0")
    page.locator("#e-counts, #fit-summary").filter(has_text="not a GPU count").wait_for()
    page.locator("#fit-counts").fill("")
    w8 = _weights(page)
    _fill(page, "#f-model", "meta-llama/Llama-3.1-70B")
    _wait_verdict(page, "DOES NOT FIT")
    w70 = _weights(page)
    # 70.6e9 bf16 parameters against 8.0e9: the weights band grows about 8.8 times
    assert 8 < w70 / w8 < 10
    _fill(page, "#f-hardware-gpu", "B200")
    page.wait_for_function("() => document.querySelector('#summary').textContent.includes('B200')")
    page.screenshot(path=str(ARTIFACTS / "web-llama-3.1-70b-lora-b200.png"), full_page=True)


def test_newcomer_answers_the_readme_question_in_under_a_minute(page: Any, server: str) -> None:
    """Issue 20's "done when": with no docs, does Llama-3.1-8B LoRA fit on an RTX 4090, and on which other GPUs?
    Typed as a newcomer would: the model and GPU picked from the search-as-you-type suggestions, LoRA chosen,
    the verdict read, then "only those that fit" ticked in "Which GPUs fit this job"."""
    from vramplan.plan.every_gpu import fit_on_every_gpu

    t0 = time.monotonic()
    page.goto(server + "/")
    page.wait_for_function("() => document.querySelector('#verdict .badge')?.textContent !== '…'")  # the first answer
    key = page.get_by_role("group", name="Model and GPU")  # the form's first box
    model = key.get_by_label("model", exact=True)
    model.fill("")
    model.press_sequentially("llama-3.1-8")
    page.locator('#models-list option[value="meta-llama/Llama-3.1-8B"]').wait_for(state="attached")
    model.fill("meta-llama/Llama-3.1-8B")  # what picking the suggestion does
    gpu = key.get_by_label("GPU", exact=True)
    gpu.fill("")
    gpu.press_sequentially("4090")
    page.locator('#gpus-list option[value="RTX-4090"]').wait_for(state="attached")
    gpu.fill("RTX-4090")
    page.locator("#f-task").select_option(label="train")
    page.locator("#f-train-peft-method").select_option(label="lora")
    page.wait_for_function("() => /Llama-3\\.1-8B on 1 × RTX-4090 \\(train\\)/.test(document.querySelector('#summary').textContent)")
    _wait_verdict(page, OPENING)
    # the answer for the RTX 4090: the point estimate fits, the band's high bound does not, and by how much
    summary = page.locator("#summary").inner_text()
    assert "headroom" in summary and "band: " in summary and "device used" in summary
    doc = {"model": "meta-llama/Llama-3.1-8B", "task": "train", "hardware": {"gpu": "RTX-4090"},
           "train": {"gradient_checkpointing": "full", "peft": {"method": "lora"}}}
    from vramplan.engine import estimate
    from vramplan.plan.remedies import remedies_and_defaults

    report = estimate(doc)
    band = report.to_json_dict()["band"]
    cls = band["classes"]["device_used"]
    assert page.locator("#verdict .band").inner_text() == (
        f"{round(band['coverage'] * 100)}% band ×{cls['factor_low']}–×{cls['factor_high']} ({cls['class']}, n = {cls['n']})")
    # what to change, as `vramplan estimate` lists it: the first verified remedy
    # (the page draws the report first and its remedies when their further estimates arrive)
    first = remedies_and_defaults(report, doc)["remedies"][0]["text"]
    playwright_sync.expect(page.locator("#remedies")).to_contain_text(first, timeout=30_000)
    # ... and on which other GPUs: the rows the library's fit_on_every_gpu calls FITS, nothing else
    page.get_by_label("only those that fit").check()
    page.wait_for_function("() => document.querySelectorAll('#fit-table tbody tr').length > 0"
                           " && document.querySelectorAll('#fit-table tbody tr.no, #fit-table tbody tr.error').length === 0")
    fits = page.evaluate("[...document.querySelectorAll('#fit-table tbody tr.fits')].map(r => r.cells[0].textContent)")
    assert json.loads(urllib.request.unquote(page.url.split("s=", 1)[1].split("&")[0])) == doc  # the link holds it
    assert fits == [r.gpu for r in fit_on_every_gpu(doc) if r.verdict == "FITS"] and len(fits) >= 10
    assert "RTX-4090" not in fits and "H100-SXM" in fits
    elapsed = time.monotonic() - t0
    assert elapsed < 60, f"the question took {elapsed:.1f} s to answer"
    # README's picture (docs/web.png is a copy of this file): from the verdict down to the GPUs that fit, in one
    # screen as tall as that (the fit table scrolls inside its box)
    bottom = page.evaluate("document.querySelector('#fit .table-wrap').getBoundingClientRect().bottom + window.scrollY")
    page.set_viewport_size({"width": 1280, "height": min(int(bottom) + 16, 2400)})
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / "web-readme.png"))


def test_form_is_the_schema_with_the_cli_help(page: Any, server: str) -> None:
    """Every scenario field the CLI makes a flag of is on the page, with the flag's help text and choices."""
    from vramplan.cli.flags import _leaf_table

    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    fields = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#scenario [data-kind]')].map(i => [
        i.dataset.path, { help: document.getElementById(i.getAttribute('aria-describedby').split(' ')[0]).textContent,
          kind: i.dataset.kind, options: i.tagName === 'SELECT' ? [...i.options].slice(1).map(o => JSON.parse(o.value)) : null,
          label: i.labels[0].textContent }]))""")
    leaves = {leaf.path: leaf for leaf in _leaf_table()}
    # model and hardware.gpu are the two search boxes at the top; every other leaf is a generated field
    assert set(fields) == set(leaves) - {"model", "hardware.gpu"}
    for path, f in fields.items():
        leaf = leaves[path]
        assert f["help"] == leaf.text.replace("``", ""), path  # cli/flags.py _help: the first paragraph
        assert f["label"] == path.split(".")[-1]
        if f["kind"] == "enum":
            assert [str(o) for o in f["options"]] == list(leaf.choices), path


def test_hover_a_band_names_what_is_behind_it(page: Any, server: str) -> None:
    """Hovering a part of the breakdown lists the tensors and modules behind it (per_gpu.breakdown_detail)."""
    from vramplan.engine import estimate

    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    detail = estimate(json.loads(urllib.request.unquote(page.url.split("s=", 1)[1]))).per_gpu.breakdown_detail
    for chart_id, part in (("chart-breakdown", "weights"), ("chart-dynamic", "activations")):
        # the bars' positions are read once the chart has stopped animating (under load the first frame's positions
        # were read while the bars still grew, and the pointer landed beside them)
        page.evaluate("id => { const c = Chart.getChart(id); c.stop(); c.options.animation = false; c.update('none'); }",
                      chart_id)
        at = page.evaluate("""([id, part]) => { const c = Chart.getChart(id); const i = c.data.datasets.findIndex(d => d.label === part);
            const el = c.getDatasetMeta(i).data[0]; return { x: (el.x + el.base) / 2, y: el.y }; }""", [chart_id, part])
        # hover() scrolls the canvas into view first: the second chart can sit below the 1000-pixel viewport, where
        # a mouse move to its page coordinates hovers nothing
        page.mouse.move(0, 0)
        page.locator("#" + chart_id).hover(position={"x": at["x"], "y": at["y"]})
        page.wait_for_function("id => Chart.getChart(id).tooltip.getActiveElements().length > 0", arg=chart_id)
        lines = page.evaluate("id => Chart.getChart(id).tooltip.body.flatMap(b => [...b.lines, ...b.after])", chart_id)
        assert lines[0].startswith(f"{part}: ")
        assert [ln.split(":")[0] for ln in lines[1:]] == sorted(detail[part], key=lambda k: -detail[part][k])[:8]
    page.locator(".chart-box").first.screenshot(path=str(ARTIFACTS / "web-hover-breakdown.png"))


def test_works_with_the_network_cut_off(browser: Any, server: str) -> None:
    """Every request but the local server's is aborted: the page still loads, answers and draws its charts,
    having asked for nothing elsewhere."""
    outside: list[str] = []
    local: list[str] = []
    ctx = _offline_context(browser, outside, local, viewport={"width": 1280, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    # the cut is real: a request to another host fails (and is recorded), so the checks below can fail
    pg.goto(server + "/healthz")
    assert pg.evaluate("fetch('https://cdn.jsdelivr.net/npm/chart.js').then(() => 'reached', () => 'blocked')") == "blocked"
    assert outside == ["https://cdn.jsdelivr.net/npm/chart.js"]
    outside.clear()
    pg.goto(server + "/")
    _wait_verdict(pg, OPENING)
    pg.wait_for_selector("#fit-table tbody tr.fits")
    drawn = pg.evaluate("['chart-breakdown', 'chart-dynamic', 'chart-levels', 'chart-phases', 'chart-lifecycle']"
                        ".map(id => Boolean(Chart.getChart(id)))")
    assert drawn == [True] * 5
    resources = pg.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert resources and all(u.startswith(server) for u in resources)
    assert any(u.endswith("/static/vendor/chart.umd.min.js") for u in local)
    assert outside == []
    ctx.close()


def test_phases_on_their_axis_and_smallest_count(page: Any, server: str) -> None:
    """The step's phases and the job's phases, each on an axis of phases in order; each GPU's smallest count."""
    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    page.wait_for_function("() => Chart.getChart('chart-lifecycle')")
    axes = page.evaluate("""() => Object.fromEntries(['chart-phases', 'chart-lifecycle'].map((id) => {
        const c = Chart.getChart(id); return [id, { ticks: c.scales.x.ticks.map((t) => t.label), peak: c.options.plugins.markLine.value,
        series: c.data.datasets.map((d) => d.label) }]; }))""")
    # the report's order (per_gpu.phases, per_gpu.lifecycle), every label shown
    assert axes["chart-phases"]["ticks"] == ["forward", "backward", "optimizer"]
    assert axes["chart-lifecycle"]["ticks"] == ["load", "first step", "training step", "checkpoint save"]
    assert axes["chart-lifecycle"]["peak"] == 2  # lifecycle_peak_phase: training step, the third
    assert axes["chart-lifecycle"]["series"] == ["allocated", "reserved", "device used"]
    page.locator("#chart-lifecycle").screenshot(path=str(ARTIFACTS / "web-lifecycle-phases.png"))
    # one row a GPU, at the smallest of 1, 2, 4, 8 that fits (LoRA does not shard: 1 where anything fits)
    page.wait_for_selector("#fit-table tbody tr.fits")
    n = page.locator("#fit-table tbody tr").count()
    page.locator("#fit-counts").fill("1,2")
    page.wait_for_function(f"() => document.querySelectorAll('#fit-table tbody tr').length === {2 * n}")
    page.locator("#fit-counts").fill("")
    page.locator("#fit-smallest").check()
    page.wait_for_function(f"() => document.querySelectorAll('#fit-table tbody tr').length === {n}")
    page.wait_for_function("() => /Fits on .* [0-9]+ × /.test(document.querySelector('#fit-summary').textContent)")
    assert "1 × " in page.locator("#fit-summary").inner_text()


def test_broken_field_shows_the_cli_message(page: Any, server: str) -> None:
    from vramplan.errors import ScenarioError
    from vramplan.spec.load import parse_scenario

    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    page.locator("#f-train-seq_len").fill("0")
    err = page.locator("#e-train-seq_len")
    err.wait_for(state="visible")
    with pytest.raises(ScenarioError) as exc:
        parse_scenario({"model": "llama-3.1-8b", "train": {"seq_len": 0}})
    assert err.inner_text() == str(exc.value.problems[0])  # the text `vramplan estimate` prints after "error:"
    assert page.locator("#f-train-seq_len").get_attribute("aria-invalid") == "true"
    page.screenshot(path=str(ARTIFACTS / "web-error-seq-len.png"))
    page.locator("#f-train-seq_len").fill("512")
    # seq_len 2048 -> 512: 17.04 GiB, band high 22.44 of 23.64 (train-peft's own worst row: x1.317)
    _wait_verdict(page, "FITS")
    assert err.inner_text() == ""


def test_compare_two_setups_and_reload_shared_url(page: Any, server: str, browser: Any) -> None:
    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    page.locator("#add-compare").click()
    page.locator("#f-hardware-gpu").fill("RTX-3080")
    _wait_verdict(page, "DOES NOT FIT")
    page.locator("#add-compare").click()
    page.wait_for_selector("#compare-table th:has-text('setup 2')", timeout=COMPARE_TIMEOUT_MS)
    assert page.locator("#compare-table thead tr").count() == 1
    assert page.locator("#compare-table thead th").count() == 3  # the row labels' column and two setups
    assert page.locator("#compare-table td.diff").count() >= 3  # GPU, device used, headroom at least
    assert "hardware.gpu" in page.locator("#compare-table").inner_text()
    page.screenshot(path=str(ARTIFACTS / "web-compare.png"), full_page=True)
    shared = page.url
    # the link opened in a fresh browser context (no state shared with the first): the same page
    outside: list[str] = []
    ctx = _offline_context(browser, outside, viewport={"width": 1280, "height": 1000})
    other = ctx.new_page()
    other.set_default_timeout(TIMEOUT_MS)
    other.goto(shared)
    _wait_verdict(other, "DOES NOT FIT")
    assert other.locator("#f-hardware-gpu").input_value() == "RTX-3080"
    other.wait_for_selector("#compare-table th:has-text('setup 2')", timeout=COMPARE_TIMEOUT_MS)
    assert other.locator("#compare-table td.diff").count() == page.locator("#compare-table td.diff").count()
    assert other.locator("#summary").inner_text() == page.locator("#summary").inner_text()
    other.screenshot(path=str(ARTIFACTS / "web-reloaded-from-link.png"), full_page=True)
    ctx.close()
    assert outside == []
    # up to four setups: two more, then the button is spent
    page.locator("#f-hardware-gpu").fill("H100-SXM")
    _wait_verdict(page, "FITS")
    page.locator("#add-compare").click()
    page.locator("#f-train-seq_len").fill("8192")  # the form's state is the setup added, answered or not
    page.locator("#add-compare").click()
    page.wait_for_selector("#compare-table th:has-text('setup 4')", timeout=COMPARE_TIMEOUT_MS)
    assert page.locator("#compare-table thead th").count() == 5
    assert page.locator("#add-compare").is_disabled()


def test_plan_and_download_the_exports(page: Any, server: str) -> None:
    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    page.locator("#run-plan").click()
    page.wait_for_selector("#plan-out .badge")
    assert page.locator("#plan-out .badge").inner_text() == "FITS"
    with page.expect_download() as dl:
        page.locator("#download-zip").click()
    data = Path(dl.value.path()).read_bytes()
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    assert "README.md" in names and len(names) >= 3
    page.screenshot(path=str(ARTIFACTS / "web-plan.png"), full_page=True)


def test_serving_panel_and_will_not_start(page: Any, server: str) -> None:
    doc = {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100"},
           "serve": {"max_model_len": 8192}}
    page.goto(server + "/#s=" + urllib.request.quote(json.dumps(doc)))
    page.wait_for_selector("#serving:not([hidden]) #serve-facts dt")
    assert page.evaluate("Chart.getChart('chart-curve').data.datasets[0].data.length") >= 4
    assert page.locator("#serve-message").inner_text().startswith("vLLM 0.11 starts")
    page.locator("#f-hardware-gpu").fill("RTX-3080")  # 16 GB of bf16 weights on a 10 GiB card
    page.wait_for_function("() => document.querySelector('#serve-message').textContent.includes('will not start')")
    page.screenshot(path=str(ARTIFACTS / "web-serve.png"), full_page=True)


def _engine_message(doc: dict[str, Any]) -> str:
    """The line the page shows for a serving document (/api/serve, = `vramplan serve --json`)."""
    from vramplan.web.routes import serve_document

    out = serve_document(doc)
    d, name = ((out["llamacpp"], "llama.cpp") if "llamacpp" in out
               else (out[out["engine"]], "SGLang " + out["sglang"]["sglang_version"]))
    starts = out["fits"] if "llamacpp" in out else d["starts"]
    return f"{name} starts." if starts else f"{name} will not start: {d['problem']}" + (f" (change {d['fix']})" if d["fix"] else "")


def test_serving_engines_sglang_and_llamacpp(page: Any, server: str) -> None:
    """SGLang's and llama.cpp's start-up decisions, each with its own words; the curve is vLLM's only, and says so."""
    doc: dict[str, Any] = {"model": "meta-llama/Llama-3.1-8B", "task": "serve", "hardware": {"gpu": "H100-SXM"},
                           "serve": {"engine": "sglang"}}
    page.goto(server + "/#s=" + urllib.request.quote(json.dumps(doc)))
    page.wait_for_function("t => document.querySelector('#serve-message').textContent === t", arg=_engine_message(doc))
    assert "max_total_num_tokens" in page.locator("#serve-facts").inner_text()
    page.locator("#curve-note").filter(has_text="modelled for engine vllm only").wait_for()
    assert page.locator("#chart-curve").is_hidden()
    # llama.cpp on a 16 GiB card at the model's full 131,072-token context (16 GiB of f16 KV alone): its
    # cudaMalloc failure, and its log
    page.locator("#f-serve-engine").select_option(label="llamacpp")
    page.locator("#f-hardware-gpu").fill("RTX-4080")
    llama = {**doc, "hardware": {"gpu": "RTX-4080"}, "serve": {"engine": "llamacpp"}}
    assert "will not start: cudaMalloc failed" in _engine_message(llama)
    # the exact line for the final setup (llama.cpp on the H100 comes and goes on the way)
    page.wait_for_function("t => document.querySelector('#serve-message').textContent === t", arg=_engine_message(llama))
    page.locator("#serve-log summary").click()
    assert "load_tensors: offloaded 33/33 layers to GPU" in page.locator("#serve-log pre").inner_text()
    page.screenshot(path=str(ARTIFACTS / "web-serve-llamacpp.png"), full_page=True)


def test_phone_width_and_keyboard(browser: Any, server: str) -> None:
    outside: list[str] = []
    ctx = _offline_context(browser, outside, viewport={"width": 390, "height": 844}, is_mobile=True)
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(server + "/")
    _wait_verdict(pg, OPENING)
    # one column: nothing wider than the screen
    assert pg.evaluate("document.documentElement.scrollWidth") <= 390
    # the sections start closed, so the answer follows the model and GPU box; a button takes you there
    assert pg.evaluate("[...document.querySelectorAll('details.section')].every(d => !d.open)")
    pg.get_by_role("button", name="Go to the answer").click()
    # within a pixel: scrollIntoView aligns the section to a fractional position when the content above it has
    # fractional heights (seen: top -0.0625 px), which is still on the screen
    pg.wait_for_function("() => { const r = document.querySelector('#verdict').getBoundingClientRect();"
                         " return r.top >= -1 && r.bottom <= innerHeight + 1; }")
    # every form control has a label
    unlabelled = pg.evaluate("""[...document.querySelectorAll('input, select')]
        .filter(e => e.type !== 'file' && !(e.labels && e.labels.length)).map(e => e.id)""")
    assert unlabelled == []
    pg.locator("#f-model").focus()
    pg.keyboard.press("Tab")
    assert pg.evaluate("document.activeElement.tagName") in ("INPUT", "SELECT", "BUTTON")
    # labels never clip: every phase is a tick of its axis (none skipped for room) and each axis, its labels
    # included, lies inside its canvas, at the phone's width too
    pg.wait_for_function("() => Chart.getChart('chart-lifecycle')")
    axes = pg.evaluate("""['chart-breakdown', 'chart-levels', 'chart-phases', 'chart-lifecycle'].map(id => {
        const c = Chart.getChart(id); const x = c.scales.x, y = c.scales.y;
        return { id, ticks: x.ticks.length, labels: c.data.labels.length, inside: x.left >= 0 && x.right <= c.width
                 && x.bottom <= c.height && y.left >= 0 && y.top >= 0 }; })""")
    for ax in axes:
        assert ax["inside"], ax
        if ax["id"] in ("chart-phases", "chart-lifecycle", "chart-levels"):
            assert ax["ticks"] == ax["labels"], ax
    pg.screenshot(path=str(ARTIFACTS / "web-phone.png"), full_page=True)
    ctx.close()
    assert outside == []


def test_upload_config_and_inference(page: Any, server: str, tmp_path: Path) -> None:
    from vramplan.catalog.models import list_models

    (m,) = [m for m in list_models() if m.id == "meta-llama/Llama-3.1-8B"]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(m.config))
    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    w_catalog = _weights(page)
    page.locator("#f-config").set_input_files(str(cfg))
    page.wait_for_function("() => document.querySelector('#f-model').placeholder.startsWith('uploaded config.json')")
    _wait_verdict(page, OPENING)
    assert _weights(page) == w_catalog  # the same config.json, inline: the same weights
    assert '"model":{' in urllib.request.unquote(page.url).replace(" ", "")  # the upload is in the link too
    page.locator("#f-task").select_option(label="inference")
    page.wait_for_selector("#generate-facts:not([hidden]):has-text('Largest batch')")
    page.screenshot(path=str(ARTIFACTS / "web-inference-upload.png"), full_page=True)


def test_hub_id_only_when_the_server_allows_it(page: Any, server: str, fake_hub: Any) -> None:
    """A Hugging Face Hub id (the fake Hub of tests/fakehub.py on localhost, no network): refused beside the model
    field, with the CLI's hint, by a server started without --allow-hub; estimated by one started with it."""
    from vramplan.catalog.models import list_models

    (m,) = [m for m in list_models() if m.id == "meta-llama/Llama-3.1-8B"]
    fake_hub.add("someone/llama-copy", {"config.json": m.config})
    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    page.locator("#f-model").fill("someone/llama-copy")
    page.locator("#e-model").filter(has_text="--allow-hub").wait_for()
    assert fake_hub.requests == []
    with _web_server("--allow-hub") as hub_server:  # HF_ENDPOINT (the fake Hub) and HF_HOME from the fixture
        page.goto(hub_server + "/")
        _wait_verdict(page, OPENING)
        assert "Hugging Face Hub id" in page.locator("#h-model").inner_text()
        w_catalog = _weights(page)
        page.locator("#f-model").fill("someone/llama-copy")
        page.wait_for_function("() => document.querySelector('#summary').textContent.startsWith('someone/llama-copy')")
        _wait_verdict(page, OPENING)
        assert _weights(page) == w_catalog  # the same config.json, read from the Hub
        page.locator("#f-model").fill("someone/missing")
        page.locator("#e-model").filter(has_text="someone/missing").wait_for()
        page.screenshot(path=str(ARTIFACTS / "web-hub-id.png"))
    assert fake_hub.requests


def test_keyboard_alone_reaches_every_control(page: Any, server: str) -> None:
    """Tab from the top of the page reaches the search boxes, the fit options, compare, plan and download's
    neighbours in order, and a key press acts on what has focus."""
    page.goto(server + "/")
    _wait_verdict(page, OPENING)
    page.locator("body").focus()
    seen: list[str] = []
    for _ in range(400):
        page.keyboard.press("Tab")
        seen.append(page.evaluate("document.activeElement.id || document.activeElement.tagName"))
        if seen[-1] == "run-plan":
            break
    for control in ("f-model", "f-config", "f-hardware-gpu", "f-task", "share", "add-compare", "fit-counts", "fit-only",
                    "fit-smallest", "p-num_gpus", "p-peft", "run-plan"):
        assert control in seen, control
    # order: the form, then the answer's buttons, then which GPUs fit, then the plan
    assert seen.index("f-model") < seen.index("f-hardware-gpu") < seen.index("share") < seen.index("fit-only") < seen.index("run-plan")
    page.keyboard.press("Enter")  # on "Plan"
    page.wait_for_selector("#plan-out .badge")
    page.locator("#fit-only").focus()
    page.keyboard.press("Space")
    assert page.locator("#fit-only").is_checked()
    page.locator("#f-hardware-gpu").focus()
    page.keyboard.press("Control+A")
    page.keyboard.type("RTX-3080")
    _wait_verdict(page, "DOES NOT FIT")
