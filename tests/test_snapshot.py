"""OOM-snapshot reader: hand-checked figures on generated torch 2.x snapshot files, CLI, bad inputs."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

from vramplan.cli.main import app
from vramplan.measure.snapshot import (
    Frame,
    SnapshotError,
    analyze_snapshot,
    categorize,
    load_snapshot,
    read_snapshot,
    top_frame,
    write_timeline_plot,
)

DATA = Path(__file__).parent / "data" / "snapshots"
KiB, MiB = 2**10, 2**20
BASE = 0x7F0000000000
runner = CliRunner()
ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}


def run(*args: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr; stderr's whitespace folded (rich wraps a message that quotes a long
    path at the terminal's width, wherever the checkout lies)."""
    res = runner.invoke(app, list(args), env=ENV)
    return res.exit_code, res.stdout, " ".join(res.stderr.split())


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_snapshots", DATA / "make_snapshots.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fixtures_are_up_to_date() -> None:
    # the committed pickles are exactly what the generator writes
    for name, content in generator().build().items():
        assert (DATA / name).read_bytes() == content, f"{name} is stale: run make_snapshots.py"


def test_fixtures_are_read_by_torchs_own_viewer() -> None:
    # torch's _memory_viz checks segment accounting (segsum asserts free + allocated == reserved)
    mv = pytest.importorskip("torch.cuda._memory_viz")
    for name in ("oom_small", "train_step_oom", "expandable_no_oom"):
        data = pickle.loads((DATA / f"{name}.pickle").read_bytes())
        assert "total_reserved" in mv.segsum(data)
        mv.trace(data)


def test_oom_small_by_hand() -> None:
    r = read_snapshot(DATA / "oom_small.pickle")
    # The OOM is trace entry 26: 40 MiB requested, CUDA reported 30 MiB free, from AdamW's step.
    assert r.moment == "oom" and r.oom is not None
    assert (r.oom.trace_index, r.oom.request_bytes, r.oom.device_free_bytes) == (26, 40 * MiB, 30 * MiB)
    assert (r.oom.category, r.oom.top_frame) == ("optimizer_states", "train.py:35:main")
    # Alive at the OOM: W1 8 MiB + W2 64 MiB (weights), A1 6 MiB (activation freed at entry 27,
    # after the OOM, so rebuilt from the trace), g1 512 KiB block for 524,000 requested, G 32 MiB
    # (gradients). p (512 KiB) was free_requested at entry 19 -> pending, not allocated.
    assert r.num_tensors == 5
    assert r.allocated_bytes == (8 + 64 + 6 + 32) * MiB + 512 * KiB == 115_867_648
    assert r.requested_bytes == (8 + 64 + 6 + 32) * MiB + 524_000 == 115_867_360
    assert r.by_category == {"weights": 72 * MiB, "gradients": 32 * MiB + 512 * KiB, "activations": 6 * MiB}
    assert r.by_top_frame == [("train.py:20:main", 72 * MiB, 2), ("train.py:30:main", 32 * MiB + 512 * KiB, 2),
                              ("model.py:42:forward", 6 * MiB, 1)]
    assert [t.size_bytes for t in r.largest] == [64 * MiB, 32 * MiB, 8 * MiB, 6 * MiB, 512 * KiB]
    assert [t.size_exact for t in r.largest] == [True, True, True, False, True]
    # Reserved at the OOM: segments at the dump 20 + 64 + 2 + 40 = 126 MiB, no segment event after
    # entry 26 (S0's 10 MiB was released at entry 25, before the failure).
    assert r.reserved_bytes == 126 * MiB
    assert r.reserved_unallocated_bytes == 126 * MiB - (110 * MiB + 512 * KiB) == 15 * MiB + 512 * KiB
    # 40 - (30 + 15.5) = -5.5 MiB: the bytes existed, not in one piece -> fragmentation
    assert r.shortfall_bytes == -(5 * MiB + 512 * KiB)
    assert r.verdict.startswith("fragmentation")


def test_oom_small_segments_by_hand() -> None:
    r = read_snapshot(DATA / "oom_small.pickle")
    # at the dump: S1 [W1 8][free 12], S2 [W2 64], S3 [g1 0.5][free 1][p 0.5 pending], S4 [G 32][free 8]
    assert (r.dump_reserved_bytes, r.dump_allocated_bytes) == (126 * MiB, 104 * MiB + 512 * KiB)
    assert (r.inactive_bytes, r.largest_inactive_block_bytes) == (21 * MiB, 12 * MiB)
    assert r.fragmentation == pytest.approx(1 - 104.5 / 126)
    by_addr = {s.address: s for s in r.segments}
    s3 = by_addr[BASE + 160 * MiB]
    assert (s3.segment_type, s3.allocated_bytes, s3.pending_free_bytes, s3.inactive_bytes) == (
        "small", 512 * KiB, 512 * KiB, 1 * MiB)
    assert s3.internal_free_bytes == 524_288 - 524_000 == 288
    assert [s.address for s in r.segments][:2] == [BASE + 32 * MiB, BASE + 192 * MiB]  # most inactive first


def test_oom_small_timeline_by_hand() -> None:
    r = read_snapshot(DATA / "oom_small.pickle")
    # every allocation in the file is in the trace -> nothing alive before entry 0
    assert r.baseline_live_bytes == 0
    pts = {p.entry: p for p in r.timeline}
    # after entry 21 (X, 40 MiB): W1 8 + W2 64 + A1 6 + g1 524,000 + X 40 (q and p already freed)
    peak = max(r.timeline, key=lambda p: p.live_bytes)
    assert (peak.entry, peak.live_bytes) == (21, 118 * MiB + 524_000)
    assert pts[26].live_bytes == 110 * MiB + 524_000
    # reserved: 10 + 20 + 64 + 2 + 40 = 136 MiB from entry 20 until S0 is freed at entry 25
    assert pts[24].reserved_bytes == 136 * MiB and pts[25].reserved_bytes == 126 * MiB
    assert pts[-1].reserved_bytes == 0


def test_train_step_oom_by_hand() -> None:
    # 4 x Linear(1024 -> 4096) fp32: weights 16 MiB + bias 16 KiB each; AdamW's lazy state init
    # runs out of memory at exp_avg_sq of layer 1 (capacity 200 MiB, see make_snapshots.py).
    r = read_snapshot(DATA / "train_step_oom.pickle")
    assert r.oom is not None and r.oom.request_bytes == 16 * MiB and r.oom.category == "optimizer_states"
    assert r.by_category == {
        "gradients": 4 * (16 * MiB + 16 * KiB),
        "weights": 4 * (16 * MiB + 16 * KiB),
        # exp_avg + exp_avg_sq of layer 0 weight and bias, exp_avg of layer 1 weight
        "optimizer_states": 3 * 16 * MiB + 2 * 16 * KiB,
        "other": 512,                         # the 4-byte loss from cross_entropy in train.py
    }
    # reserved: weights 4 x 16 + small 2 = 66; activations two 20 MiB segments (106); backward adds
    # grad_w3 16 and two 20 MiB segments for input gradients (162); the states add 16 + 16 -> 194.
    assert r.reserved_bytes == 194 * MiB
    assert r.oom.device_free_bytes == 200 * MiB - 194 * MiB
    assert len(r.segments) == 12
    # the four 20 MiB segments each keep a 4 MiB remainder that no 16 MiB request can use
    assert sorted(s.largest_inactive_block_bytes for s in r.segments if s.total_size == 20 * MiB) == [4 * MiB] * 4
    assert r.verdict.startswith("fragmentation")


def test_expandable_ring_buffer_snapshot() -> None:
    r = read_snapshot(DATA / "expandable_no_oom.pickle")
    assert r.oom is None and r.moment == "dump" and r.shortfall_bytes is None
    assert all(s.is_expandable for s in r.segments) and len(r.segments) == 2
    assert r.allocator_settings["expandable_segments"] is True
    # weights + grads + AdamW states: 4 x (16 MiB + 16 KiB) x 4; the loss is pending free
    assert r.allocated_bytes == 16 * (16 * MiB + 16 * KiB)
    assert r.by_category["optimizer_states"] == 8 * (16 * MiB + 16 * KiB)
    # the trace kept the last 40 entries only: weights, gradients and some states predate it
    assert r.baseline_live_bytes > 0
    assert any("before the first trace entry" in n for n in r.notes)
    # C++ frames come first in these stacks; the top frame is still the Python line
    assert r.by_top_frame[0][0] == "train.py:35:main"
    assert r.largest_inactive_block_bytes == 4 * MiB


def test_heuristics() -> None:
    site = "/x/site-packages/torch"
    assert categorize([Frame(f"{site}/optim/adam.py", 1, "_single_tensor_adam")]) == "optimizer_states"
    assert categorize([Frame("??", 0, "torch::autograd::AccumulateGrad::apply")]) == "gradients"
    assert categorize([Frame(f"{site}/utils/checkpoint.py", 1, "recompute_fn"),
                       Frame(f"{site}/autograd/graph.py", 1, "_engine_run_backward")]) == "activations"
    assert categorize([Frame("/x/transformers/cache_utils.py", 1, "update")]) == "kv_cache"
    assert categorize([Frame("/x/transformers/modeling_utils.py", 1, "from_pretrained")]) == "weights"
    assert categorize([Frame("/m/model.py", 3, "forward")]) == "activations"
    assert categorize([Frame("/m/train.py", 3, "main")]) == "other"
    assert categorize([]) == "other"
    assert top_frame([Frame("??", 0, "c10::malloc"), Frame(f"{site}/nn/modules/linear.py", 125, "forward"),
                      Frame("/m/model.py", 42, "forward")]) == "model.py:42:forward"
    assert top_frame([Frame(f"{site}/nn/modules/linear.py", 125, "forward")]) == "linear.py:125:forward"
    assert top_frame([Frame("??", 0, "c10::malloc")]) == "??:0:c10::malloc"
    assert top_frame([]) == "<no stack recorded>"


def test_device_choice_and_legacy_blocks() -> None:
    data: dict[str, Any] = pickle.loads((DATA / "oom_small.pickle").read_bytes())
    # torch 2.0 layout: frames and requested size inside history[0]; no block addresses
    for seg in data["segments"]:
        for b in seg["blocks"]:
            b["history"] = [{"addr": b.pop("address"), "real_size": b.pop("requested_size"),
                             "frames": b.pop("frames")}]
    # an action this reader does not know is ignored, with a note
    data["device_traces"][0].insert(3, {"action": "mempool_event", "size": 0, "stream": 0})
    r = analyze_snapshot(data)
    assert r.allocated_bytes == 115_867_648
    assert any("mempool_event" in n for n in r.notes)
    data["device_traces"][0][3]["action"] = 7
    with pytest.raises(SnapshotError, match="'action' should be a string"):
        analyze_snapshot(data)
    data["device_traces"][0].pop(3)
    with pytest.raises(SnapshotError, match="device 3"):
        analyze_snapshot(data, device=3)


def test_cli_text_and_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(DATA)
    code, out, _ = run("snapshot", "oom_small.pickle")
    assert code == 0
    snap = DATA / "oom_small.txt"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        snap.write_text(out)
    assert out == snap.read_text()
    assert "tried to allocate 40.00 MiB" in out and "Verdict: fragmentation" in out
    assert "train.py:20:main" in out and "72.00 MiB" in out
    code, out, _ = run("snapshot", str(DATA / "oom_small.pickle"), "--json", "--top", "2")
    assert code == 0
    doc = json.loads(out)
    assert doc["oom"]["request_bytes"] == 40 * MiB and doc["allocated_bytes"] == 115_867_648
    assert doc["by_category"]["weights"] == 72 * MiB and len(doc["largest"]) == 2
    assert doc["segments"]["largest_inactive_block_bytes"] == 12 * MiB
    assert doc["timeline"]["points"][0]["entry"] == -1


def test_plots(tmp_path: Path) -> None:
    r = read_snapshot(DATA / "oom_small.pickle")
    page = write_timeline_plot(r, tmp_path / "t.html").read_text()
    # the page's chart (charts.js drawSnapshot) with the data embedded; nothing fetched
    assert "VramplanCharts.drawSnapshot" in page and "OOM: 40.0 MiB" in page and "<script src" not in page
    pytest.importorskip("matplotlib")
    code, _, _ = run("snapshot", str(DATA / "train_step_oom.pickle"), "--plot", str(tmp_path / "t.png"))
    assert code == 0
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("name", "message"), [
    ("missing.pickle", "file not found"),
    ("not_a_pickle.pickle", "not a pickle file"),
    ("truncated.pickle", "not a pickle file"),
    ("wrong_structure.pickle", "expected a dict with 'segments' and 'device_traces'"),
    ("missing_keys.pickle", "missing 'device_traces'"),
    ("unsafe.pickle", "refused to load: the file references builtins.len"),
    ("bad_block.pickle", "segments[0].blocks[0]: missing 'size'"),
])
def test_bad_inputs_exit_2_with_a_message(name: str, message: str) -> None:
    code, out, err = run("snapshot", str(DATA / name))
    assert code == 2
    assert message in " ".join(err.split())
    assert "Traceback" not in out + err
    with pytest.raises(SnapshotError):
        read_snapshot(DATA / name)


def test_bad_options_exit_2(tmp_path: Path) -> None:
    code, _, err = run("snapshot", str(DATA / "oom_small.pickle"), "--plot", str(tmp_path / "t.svg"))
    assert code == 2 and "use a .png or .html" in err
    code, _, err = run("snapshot", str(DATA / "oom_small.pickle"), "--device", "1")
    assert code == 2 and "devices present: 0" in err
    code, _, err = run("snapshot", str(DATA))
    assert code == 2 and "is a directory" in err


_CALLS: list[str] = []


def _boom() -> dict[str, Any]:
    _CALLS.append("executed")
    return {"segments": [], "device_traces": []}


def test_load_snapshot_never_executes_code(tmp_path: Path) -> None:
    evil = f"c{__name__}\n_boom\n(tR.".encode()
    assert pickle.loads(evil) == {"segments": [], "device_traces": []}  # plain pickle runs it
    assert _CALLS == ["executed"]
    path = tmp_path / "evil.pickle"
    path.write_bytes(evil)
    with pytest.raises(SnapshotError, match="refused to load"):
        load_snapshot(path)
    assert _CALLS == ["executed"]  # load_snapshot did not
