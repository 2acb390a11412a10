from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# No test opens a network connection: a Hub id not in the catalog resolves from the Hugging Face cache only
# (catalog/hub.py reads HF_HUB_OFFLINE at each call, and huggingface_hub at import refuses every request),
# in this process and in the subprocesses tests start.  The fake Hub's tests (test_hub.py) lift it for
# themselves, against a local server.
os.environ["HF_HUB_OFFLINE"] = "1"
# and an empty Hugging Face cache: a model cached on the machine running the tests changes no answer
os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="vramplan-tests-hf-")
os.environ.pop("HF_HUB_CACHE", None)
os.environ.pop("HUGGINGFACE_HUB_CACHE", None)
os.environ.pop("HF_ENDPOINT", None)
# huggingface_hub's user-agent telemetry would fetch {endpoint}/api/agent-harnesses (utils/_detect_agent.py)
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"

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


@pytest.fixture
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A local stand-in for the Hugging Face Hub (tests/fakehub.py) at ``HF_ENDPOINT``, with its own cache
    (``HF_HOME`` in ``tmp_path``), the network allowed to reach it and no token."""
    import fakehub

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    from huggingface_hub import constants

    # read once at import (constants.py): conftest set it above for every other test
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    for hub in fakehub.serve(fakehub.FakeHub()):
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub
