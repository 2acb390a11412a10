"""The page in a real browser: Debian's Chromium driven by Playwright for Python.

A uvicorn server (``vramplan web``) runs on a free localhost port for the module; each test opens the
page, acts as a user would (pick a model and a GPU, break a field, compare, plan, download, reload a
shared link) and reads what the page shows.  Screenshots go to ``test-artifacts/`` (git-ignored).
Playwright's own browser download is not used: the system Chromium is launched by path.  The tests
skip, saying why, only when that Chromium (or the Python packages) is absent; ``.ci/run`` installs it.
"""

from __future__ import annotations

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

TIMEOUT_MS = 15_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "vramplan.cli.main", "web", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stdout.read().decode() if proc.stdout else "server exited") from None
                time.sleep(0.1)
        else:
            raise RuntimeError("the server did not answer /healthz in 30 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    # the page must work with the network cut off: any request that leaves localhost fails the test
    outside: list[str] = []
    ctx.route("**/*", lambda route: route.continue_() if route.request.url.startswith("http://127.0.0.1")
              else (outside.append(route.request.url), route.abort()))
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
    # README's picture (docs/web.png is a copy): the verdict and the GPUs that fit, in one screen
    page.locator("#fit-only").check()
    page.wait_for_function("() => document.querySelectorAll('#fit-table tbody tr.no').length === 0")
    assert "Fits on" in page.locator("#fit-summary").inner_text()
    page.set_viewport_size({"width": 1280, "height": 1250})
    page.screenshot(path=str(ARTIFACTS / "web-readme.png"))
    page.locator("#fit-only").uncheck()
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
    page.wait_for_selector("#compare-table th:has-text('setup 2')")
    assert page.locator("#compare-table thead tr").count() == 1
    assert page.locator("#compare-table thead th").count() == 3  # the row labels' column and two setups
    assert page.locator("#compare-table td.diff").count() >= 3  # GPU, device used, headroom at least
    assert "hardware.gpu" in page.locator("#compare-table").inner_text()
    page.screenshot(path=str(ARTIFACTS / "web-compare.png"), full_page=True)
    shared = page.url
    other = browser.new_page()
    other.set_default_timeout(TIMEOUT_MS)
    other.goto(shared)
    _wait_verdict(other, "DOES NOT FIT")
    assert other.locator("#f-hardware-gpu").input_value() == "RTX-3080"
    other.wait_for_selector("#compare-table th:has-text('setup 2')")
    other.close()


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


def test_phone_width_and_keyboard(browser: Any, server: str) -> None:
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    pg.goto(server + "/")
    _wait_verdict(pg, OPENING)
    # one column: nothing wider than the screen
    assert pg.evaluate("document.documentElement.scrollWidth") <= 390
    # every form control has a label
    unlabelled = pg.evaluate("""[...document.querySelectorAll('input, select')]
        .filter(e => e.type !== 'file' && !(e.labels && e.labels.length)).map(e => e.id)""")
    assert unlabelled == []
    pg.locator("#f-model").focus()
    pg.keyboard.press("Tab")
    assert pg.evaluate("document.activeElement.tagName") in ("INPUT", "SELECT", "BUTTON")
    pg.screenshot(path=str(ARTIFACTS / "web-phone.png"), full_page=True)
    ctx.close()


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
