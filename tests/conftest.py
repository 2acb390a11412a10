from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def examples() -> Path:
    return EXAMPLES


# Debian's Chromium, launched by path through Playwright (its own browser download is not reachable):
# the browser tests (test_web_browser.py, test_timeline_browser.py) share it; they skip, saying why,
# only when that Chromium or Playwright is absent (.ci/run installs both).
CHROMIUM = os.environ.get("VRAMPLAN_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")
    if exe is None:
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")
    playwright_sync = pytest.importorskip("playwright.sync_api", reason="needs playwright (the dev extra)")
    ARTIFACTS.mkdir(exist_ok=True)
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()
