"""The seed articles' scenarios, planned: a setup that fits, and the reasons the cheaper ones do not.

Seed 000 opens with Llama 3 70B full fine-tuning on eight A100 80GB ("over 1 TB" naively); seeds
002/004 show a 7B model's full fine-tuning overflowing one A100 80GB at 16 bytes per parameter;
seed 003 recommends QLoRA for 7B models on 24 GB consumer cards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vramplan.engine import estimate
from vramplan.plan import TrainJob, plan
from vramplan.plan.fit import band_fits
from vramplan.plan.result import PlanResult
from vramplan.units import TB, GiB

ROOT = Path(__file__).resolve().parents[1]


def _fits_by_estimator(res: PlanResult) -> None:
    assert res.chosen is not None
    rep = estimate(res.chosen.scenario)  # from the document, through full validation
    assert rep.per_gpu.device_used_bytes <= int(rep.per_gpu.capacity_bytes * (1 - res.margin))
    assert rep.per_gpu.device_used_bytes == res.chosen.device_used_bytes


def _rung(res: PlanResult, title_start: str) -> object:
    return next(r for r in res.ladder if r.title.startswith(title_start))


@pytest.fixture(scope="module")
def llama70b() -> PlanResult:
    # seed 000: sequences of 2048 tokens, 4 per GPU -> a global batch of 32
    return plan("meta-llama/Meta-Llama-3-70B", "A100-80GB", 8, TrainJob(seq_len=2048, global_batch=32))


def test_llama3_70b_on_8xa100_fits_with_offload(llama70b: PlanResult) -> None:
    res = llama70b
    assert res.fits
    _fits_by_estimator(res)
    c = res.chosen
    assert c is not None
    # 16 B/parameter sharded 8 ways is 140 GB per GPU: nothing fits without moving state to the host
    assert c.setup["offload"] != "none"
    assert c.host_offloaded_bytes_per_gpu > 100 * GiB
    assert c.setup["micro_batch_size"] * c.setup["grad_accum_steps"] * 8 == 32  # the global batch is kept
    assert any("host memory" in line for line in res.explanation)


def test_llama3_70b_naive_and_zero_rungs_do_not_fit(llama70b: PlanResult) -> None:
    res = llama70b
    naive = res.ladder[0]
    assert naive.title.startswith("naive") and not naive.fits
    assert naive.device_used_bytes > 1 * TB  # the seed's "over 1 TB"
    zero3 = _rung(res, "ZeRO-3")
    assert not zero3.fits  # type: ignore[attr-defined]
    # ZeRO-3 alone: optimizer states 70.6e9 * 8 B / 8 = 70.6 GB (65.7 GiB) are the largest part; with the fp32
    # masters (32.9 GiB), the bf16 parameter and gradient partitions (16.4 GiB each) the model states alone are
    # 131.5 GiB, over the 71.3 GiB usable by 60 GiB before any activation or the step's one-sub-group fp32 gradient
    assert zero3.largest_parts[0][0] == "optimizer_states"  # type: ignore[attr-defined]
    assert zero3.over_bytes > 60 * GiB  # type: ignore[attr-defined]
    assert res.ladder[-1].fits and "offload" in res.ladder[-1].title.lower()
    assert "ZeRO-3" in " ".join(res.explanation)
    # the naive example scenario from examples/ does not fit either
    assert not estimate(ROOT / "examples" / "llama3-70b-naive-8xa100.yaml").fits


def test_llama2_7b_on_one_a100() -> None:
    res = plan("meta-llama/Llama-2-7b-hf", "A100-80GB", 1, TrainJob(seq_len=2048, global_batch=16))
    assert res.fits
    _fits_by_estimator(res)
    assert res.chosen is not None
    # 16 bytes per parameter (112 GB) is more than the GPU: the answer keeps optimizer state on the host
    assert res.chosen.setup["offload"] != "none"
    eight_bit = _rung(res, "8-bit AdamW")
    # 8-bit states alone are not enough: fp32 weights and gradients (autocast keeps fp32 parameters) remain
    assert not eight_bit.fits and 0 < eight_bit.over_bytes < 20 * GiB  # type: ignore[attr-defined]
    assert {p for p, _ in eight_bit.largest_parts} == {"weights", "gradients"}  # type: ignore[attr-defined]
    assert not _rung(res, "gradient checkpointing").fits  # type: ignore[attr-defined]
    # allowing pure bf16 (no fp32 masters) gives a faster setup without offload
    pure = plan("meta-llama/Llama-2-7b-hf", "A100-80GB", 1,
                TrainJob(seq_len=2048, global_batch=16, allow_pure_bf16=True))
    assert pure.chosen is not None and pure.chosen.setup["precision"] == "bf16-true"
    assert pure.chosen.step_time_s < res.chosen.step_time_s


@pytest.mark.parametrize("gpu", ["RTX-4090", "RTX-3090"])
def test_qlora_7b_on_a_24gb_card(gpu: str) -> None:
    res = plan("meta-llama/Llama-2-7b-hf", gpu, 1, TrainJob(seq_len=1024, global_batch=16, peft="qlora"))
    assert res.fits
    _fits_by_estimator(res)
    c = res.chosen
    assert c is not None and c.setup["peft"] == "qlora" and c.setup["quantization"] == "nf4-dq"
    # full fine-tuning shown for scale: ~112 GB against 24 GB
    assert res.ladder[0].title.startswith("naive") and res.ladder[0].over_bytes > 80 * GiB
    assert res.ladder[-1].title.startswith("QLoRA") and res.ladder[-1].fits
    # the 4-bit base: 6.74e9 weights at ~4.13 bits is ~3.5 GB, far below the bf16 base's 13.5 GB
    assert c.report.per_gpu.breakdown["weights"] < 5 * GiB


def test_nothing_fits_says_what_would() -> None:
    # global batch 16, so that data parallelism can reach 128 GPUs (TP8 x DP16): with the allocator
    # replay's reserved bytes no count up to 64 fits this 8k-token job on 24 GB cards
    res = plan("meta-llama/Meta-Llama-3-70B", "RTX-4090", 1, TrainJob(seq_len=8192, global_batch=16))
    assert not res.fits and res.chosen is None
    kinds = {s.kind: s for s in res.suggestions}
    assert {"more_gpus", "larger_gpu", "shorter_sequence"} <= set(kinds)
    # the shorter sequence fits on this GPU and one token more does not, by the search's rule (within the
    # margin and the band's verdict FITS, plan/fit.py), checked by the estimator
    best = kinds["shorter_sequence"].value
    assert isinstance(best, int) and 0 < best < 8192
    doc = kinds["shorter_sequence"].scenario
    rep = estimate(doc)
    assert doc["train"]["seq_len"] == best and rep.per_gpu.device_used_bytes <= res.usable_bytes and band_fits(rep)
    longer = estimate({**doc, "train": {**doc["train"], "seq_len": best + 1}})
    assert longer.per_gpu.device_used_bytes > res.usable_bytes or not band_fits(longer)
    for kind in ("more_gpus", "larger_gpu"):
        rep = estimate(kinds[kind].scenario)
        assert rep.per_gpu.device_used_bytes <= int(rep.per_gpu.capacity_bytes * 0.9)
    # the smallest catalog GPU above 24 GB that fits by the search's rule: the RTX-5090 (31.4 GiB) fits on the
    # point estimate but not under the band, and `plan` on 1 x RTX-5090 finds nothing; with the full fine-tuning
    # band at x1.447 (7 published sources) the A800-40GB (40,000,000,000 B) does not either, the A100-40GB
    # (42,298,834,944 B) does
    assert kinds["larger_gpu"].value == "A100-40GB"
    assert not plan("meta-llama/Meta-Llama-3-70B", "A800-40GB", 1, TrainJob(seq_len=8192, global_batch=16),
                    explain=False).fits
    assert plan("meta-llama/Meta-Llama-3-70B", "A100-40GB", 1, TrainJob(seq_len=8192, global_batch=16),
                explain=False).fits
    assert kinds["more_gpus"].value is not None and kinds["more_gpus"].value > 1
