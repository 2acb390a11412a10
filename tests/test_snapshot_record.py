"""vramplan.measure.record.record(): warns once without CUDA; with CUDA (faked here) dumps on OOM."""

from __future__ import annotations

import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from vramplan.measure import record as record_mod
from vramplan.measure.record import record
from vramplan.measure.snapshot import read_snapshot

DATA = Path(__file__).parent / "data" / "snapshots"


@pytest.fixture(autouse=True)
def fresh_warning_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_mod, "_warned", False)


def test_cpu_only_warns_once_and_does_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():  # pragma: no cover - this test is about machines without CUDA
        pytest.skip("CUDA is available")
    target = tmp_path / "oom.pickle"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ran = []
        with record(path=target):
            ran.append(1)
        with record(path=target):
            ran.append(2)
        with pytest.raises(torch.OutOfMemoryError), record(path=target):
            raise torch.OutOfMemoryError("not from CUDA")
    assert ran == [1, 2]
    assert [str(w.message) for w in caught] == [
        "vramplan.record(): CUDA is not available on this machine; nothing is recorded"]
    assert not target.exists()


def test_without_torch_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.warns(RuntimeWarning, match="torch is not installed"), record():
        pass


class FakeCuda:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.snapshot = pickle.loads((DATA / "oom_small.pickle").read_bytes())

    def record_memory_history(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)

    def take_snapshot(self) -> dict[str, Any]:
        return self.snapshot  # type: ignore[no-any-return]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    torch = pytest.importorskip("torch")
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", fake.record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", fake.take_snapshot)
    return fake


def test_oom_dumps_the_snapshot_and_reraises(fake_cuda: FakeCuda, tmp_path: Path) -> None:
    import torch

    target = tmp_path / "oom.pickle"
    with pytest.raises(torch.OutOfMemoryError) as exc, record(path=target, max_entries=123):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 MiB")
    assert fake_cuda.calls == [
        {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 123},
        {"enabled": None},                           # switched off when the block ends
    ]
    assert any("vramplan snapshot" in note for note in exc.value.__notes__)
    report = read_snapshot(target)                   # the dump is readable by the reader
    assert report.oom is not None and report.oom.request_bytes == 40 * 2**20


def test_other_errors_do_not_dump(fake_cuda: FakeCuda, tmp_path: Path) -> None:
    target = tmp_path / "oom.pickle"
    with pytest.raises(KeyError), record(path=target):
        raise KeyError("x")
    assert not target.exists()
    assert fake_cuda.calls[-1] == {"enabled": None}


def test_dump_on_exit(fake_cuda: FakeCuda, tmp_path: Path) -> None:
    target = tmp_path / "end.pickle"
    with record(path=target, dump_on_exit=True, stacks="all"):
        pass
    assert pickle.loads(target.read_bytes()) == fake_cuda.snapshot
    assert fake_cuda.calls[0]["stacks"] == "all"


def test_bad_max_entries() -> None:
    with pytest.raises(ValueError, match="max_entries"), record(max_entries=0):
        pass
