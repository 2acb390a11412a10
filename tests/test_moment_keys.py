"""The declared breakdown keys (analytic/moment.py): every report row is declared, once, with its flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from vramplan import estimate
from vramplan.analytic.moment import KEYS, PHASES, K, Key, Moment, key_for
from vramplan.measure.result import comparable_prediction
from vramplan.spec.load import read_document

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parents[1] / "examples").iterdir()
                  if p.suffix in (".yaml", ".json", ".toml"))


def test_labels_are_unique_per_part() -> None:
    seen = [(k.part, k.label) for k in KEYS]
    assert len(seen) == len(set(seen))


def test_moment_refuses_undeclared_keys_and_phases() -> None:
    with pytest.raises(TypeError, match="declared Key"):
        Moment("forward").add(("other", "cuBLAS workspace"), 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="undeclared phase"):
        Moment("checkpoint-save-that-nobody-declared")
    with pytest.raises(ValueError, match="part"):
        Key("workspace", "x", "not a breakdown part")


def test_templated_label_is_filled() -> None:
    mo = Moment("serve").add(K.KV_BLOCKS, 10, blocks=28_099, block_size=16)
    assert mo.parts == {"kv_cache": {"28,099 blocks of 16 tokens": 10}}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_report_row_is_declared(path: Path) -> None:
    doc = read_document(path)
    report = estimate(doc)
    phases = {p.name for p in PHASES}
    assert report.per_gpu.peak_phase in phases
    for part, rows in report.per_gpu.breakdown_detail.items():
        for label in rows:
            declared = key_for(part, label) is not None or any(
                k.templated and k.part == part for k in KEYS)
            assert declared, f"{path.name}: ({part}, {label}) is not declared in analytic/moment.py"


@pytest.mark.parametrize("task", ["train", "inference"])
def test_cpu_measure_removes_the_cublas_workspace_of_every_task(task: str) -> None:
    # GPT-2 on a T4 (Turing: not Hopper), so each cuBLAS handle's workspace is
    # CUBLAS_WORKSPACE_DEFAULT_BYTES = 4096 KiB * 2 + 16 KiB * 8 = 8,388,608 + 131,072 = 8,519,680 B.
    # Training has two handles (forward thread and autograd thread): 17,039,360 B; inference one.
    doc = read_document(EXAMPLES[[p.name for p in EXAMPLES].index("gpt2-eager-fp32-t4.yaml")])
    if task == "inference":
        doc = {"model": doc["model"], "task": "inference", "hardware": doc["hardware"],
               "inference": {"batch_size": 1, "prompt_len": 128, "new_tokens": 16, "dtype": "fp32"}}
    report = estimate(doc)
    _, excluded = comparable_prediction(report, "cpu")
    assert excluded == {"other.cuBLAS workspaces": 17_039_360 if task == "train" else 8_519_680}
    _, on_cuda = comparable_prediction(report, "cuda")
    assert on_cuda == {}
