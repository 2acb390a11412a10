"""hardware.memory_in_use_gib: memory other processes hold on each GPU when the job starts.

The job's capacity is the device's memory less that share; engines that size themselves from the memory
free at start (SGLang, llama.cpp) or check it (vLLM's free-memory check) see it, and vLLM releases whose
budget rule counts every non-torch byte on the device (0.6.4, 0.8.0-0.9.0) take it from the KV cache.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from vramplan import estimate
from vramplan.catalog.resolve import resolve
from vramplan.cli.main import app
from vramplan.errors import ScenarioError
from vramplan.serve.llamacpp import decide as decide_llamacpp
from vramplan.serve.sglang import decide_sglang
from vramplan.serve.vllm import decide
from vramplan.units import GiB

ENV = {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner()
H100_TOTAL = 85_017_755_648  # catalog totalGlobalMem of the H100-SXM (catalog/data/gpus.json)
RTX4080_TOTAL = 16_828_596_224  # catalog total of the RTX 4080 (16,376 MiB + the driver's share)


def train_doc(in_use_gib: float = 0.0, micro_batch: int = 1) -> dict[str, Any]:
    return {"model": "Qwen/Qwen2.5-0.5B-Instruct", "task": "train",
            "hardware": {"gpu": "RTX-4080", "memory_in_use_gib": in_use_gib},
            "train": {"micro_batch_size": micro_batch, "seq_len": 1024, "precision": "bf16-mixed",
                      "optimizer": "adamw", "gradient_checkpointing": "full"}}


def serve_doc(in_use_gib: float, **serve: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.1-8B", "task": "serve",
            "hardware": {"gpu": "H100-SXM", "memory_in_use_gib": in_use_gib}, "serve": serve}


def test_resolve_takes_the_share_out_of_the_capacity_and_says_so() -> None:
    r = resolve(train_doc(1.5))
    # 1.5 GiB = 1,610,612,736 B; capacity 16,828,596,224 - 1,610,612,736 = 15,217,983,488 B
    assert r.gpu.in_use_by_others_bytes == 1_610_612_736
    assert r.gpu.total_memory_bytes == 15_217_983_488
    assert r.gpu.device_total_bytes == RTX4080_TOTAL
    assert any("other processes hold 1.50 GiB" in a for a in r.assumptions)
    assert r.gpu.report_block() == {"name": "RTX-4080", "total_memory_bytes": RTX4080_TOTAL,
                                    "in_use_by_others_bytes": 1_610_612_736}
    # nothing held: the block keeps its two keys (reports of existing scenarios unchanged)
    assert resolve(train_doc()).gpu.report_block() == {"name": "RTX-4080", "total_memory_bytes": RTX4080_TOTAL}


def test_training_report_headroom_loses_exactly_the_share() -> None:
    free, held = estimate(train_doc()), estimate(train_doc(1.0))
    # the step itself is the same: only what is left for it changes
    assert held.per_gpu.peak_allocated_bytes == free.per_gpu.peak_allocated_bytes
    assert held.per_gpu.device_used_bytes == free.per_gpu.device_used_bytes
    assert held.per_gpu.capacity_bytes == RTX4080_TOTAL - GiB
    assert held.per_gpu.headroom_bytes == free.per_gpu.headroom_bytes - GiB
    assert held.gpu["in_use_by_others_bytes"] == GiB and held.gpu["total_memory_bytes"] == RTX4080_TOTAL


def test_a_share_that_leaves_too_little_turns_the_verdict() -> None:
    base = estimate(train_doc())
    assert base.fits
    pg = base.per_gpu
    # leave 100 MiB less than the allocated peak plus the memory outside the allocator (the allocator can
    # release its cache near the capacity, so only what is allocated is a floor): it cannot fit
    over = (pg.capacity_bytes - pg.peak_allocated_bytes - sum(pg.outside_allocator.values()) + 100 * 2**20) / GiB
    held = estimate(train_doc(over))
    assert not held.fits and held.verdict == "DOES NOT FIT"
    # with the headroom held but 200 MiB, the allocator model frees its cache and retries: the step still fits
    assert estimate(train_doc((pg.headroom_bytes - 200 * 2**20) / GiB)).fits


def test_a_share_as_large_as_the_device_is_refused_with_the_limit() -> None:
    with pytest.raises(ScenarioError) as exc:
        resolve(train_doc(16.0))
    text = str(exc.value)
    assert "hardware.memory_in_use_gib" in text and "below 15.67" in text


def test_cli_refusal_exits_2_without_a_traceback() -> None:
    res = runner.invoke(app, ["estimate", "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--gpu", "RTX-4080",
                              "--memory-in-use-gib", "40"], env=ENV)
    assert res.exit_code == 2 and "Traceback" not in res.output and "memory_in_use_gib" in res.output


def test_vllm_v1_keeps_its_kv_budget_but_checks_free_memory() -> None:
    # vLLM >= 0.9.1 (profiled_increase): requested = 0.9 x total, measured from a snapshot taken after other
    # processes' memory is in use, so the KV cache is the same; only the start-up check sees the share
    free, held = decide(resolve(serve_doc(0, max_model_len=8192)), "0.11"), decide(
        resolve(serve_doc(2, max_model_len=8192)), "0.11")
    assert held.available_kv_bytes == free.available_kv_bytes and held.starts
    assert held.requested_bytes == int(H100_TOTAL * 0.9) == 76_515_980_083
    # 10 GiB held: free at start = 85,017,755,648 - context 731,906,048 - 10,737,418,240 = 73,548,431,360 B
    # < requested 76,515,980,083 B -> "Free memory on device (68.50/79.18 GiB) ..."; the largest utilisation
    # that starts: 73,548,431,360 / 85,017,755,648 = 0.865 -> 0.86
    d = decide(resolve(serve_doc(10, max_model_len=8192)), "0.11")
    assert not d.starts and "Free memory on device (68.50/79.18 GiB)" in d.problem
    assert d.fix == "serve.gpu_memory_utilization <= 0.86" and d.in_use_by_others_bytes == 10 * GiB


def test_vllm_064_charges_other_processes_to_the_kv_cache() -> None:
    # vLLM 0.6.4 (peak_plus_non_torch): every byte on the device torch did not allocate comes out of
    # total x util, other processes' 2 GiB included: the KV budget shrinks by exactly 2,147,483,648 B
    free, held = decide(resolve(serve_doc(0, max_model_len=8192)), "0.6.4"), decide(
        resolve(serve_doc(2, max_model_len=8192)), "0.6.4")
    assert free.available_kv_bytes - held.available_kv_bytes == 2 * GiB
    # 0.6.0-0.6.3 (free_delta): the share is in the first snapshot, so the budget is unchanged
    assert (decide(resolve(serve_doc(0, max_model_len=8192)), "0.6.0").available_kv_bytes
            == decide(resolve(serve_doc(2, max_model_len=8192)), "0.6.0").available_kv_bytes)


def test_sglang_sizes_its_pool_from_what_is_free() -> None:
    d = decide_sglang(resolve(serve_doc(2, engine="sglang", sglang_version="0.4.1")))
    # free at start = 85,017,755,648 - context 550,429,000 - 2 GiB 2,147,483,648 = 82,319,843,000 B
    assert d.free_at_start_bytes == 82_319_843_000
    # pool = 0.88 x 82,319,843,000 - weights 16,127,631,360 = 56,313,830,480 B // 131,072 B per token
    # = 429,640 tokens (444,058 with nothing held: tests/test_serve_sglang.py)
    assert d.mem_fraction_static == 0.88 and d.max_total_num_tokens == 429_640
    assert d.total_memory_bytes == H100_TOTAL and d.to_dict()["in_use_by_others_bytes"] == 2 * GiB


def test_llamacpp_fits_less_context() -> None:
    base: dict[str, Any] = {"engine": "llamacpp", "max_model_len": 8192}
    free = decide_llamacpp(resolve(serve_doc(0, **base)))
    held = decide_llamacpp(resolve(serve_doc(70, **base)))
    # the buffers are the same; the largest n_ctx that fits beside them shrinks with the 70 GiB held
    assert held.device_used_bytes == free.device_used_bytes
    assert held.n_ctx_that_fits < free.n_ctx_that_fits
    assert held.total_memory_bytes == free.total_memory_bytes == H100_TOTAL
    assert "in_use_by_others_bytes" not in free.to_dict() and held.to_dict()["in_use_by_others_bytes"] == 70 * GiB


def test_serve_json_fits_counts_the_share() -> None:
    res = runner.invoke(app, ["serve", "--model", "meta-llama/Llama-3.1-8B", "--gpu", "H100-SXM",
                              "--max-model-len", "8192", "--memory-in-use-gib", "10", "--json"], env=ENV)
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["fits"] is False and doc["vllm"]["in_use_by_others_bytes"] == 10 * GiB


@settings(max_examples=15, deadline=None)
@given(st.floats(min_value=0.0, max_value=8.0, allow_nan=False))
def test_the_share_never_changes_the_step_only_its_room(in_use_gib: float) -> None:
    free, held = estimate(train_doc()), estimate(train_doc(in_use_gib))
    share = int(in_use_gib * GiB)
    assert held.per_gpu.capacity_bytes == free.per_gpu.capacity_bytes - share
    # the tensors are the same; the allocator model may release cached blocks sooner near a smaller
    # capacity (PyTorch frees its cache and retries before an out-of-memory error), never hold more
    assert held.per_gpu.peak_allocated_bytes == free.per_gpu.peak_allocated_bytes
    assert held.per_gpu.peak_reserved_bytes <= free.per_gpu.peak_reserved_bytes
    assert held.per_gpu.headroom_bytes == held.per_gpu.capacity_bytes - held.per_gpu.device_used_bytes
    assert held.per_gpu.headroom_bytes >= free.per_gpu.headroom_bytes - share


def test_plan_refuses_the_share_and_names_its_margin(tmp_path: Any) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("model: llama-3-8b\ntask: train\nhardware: {gpu: RTX-4090, memory_in_use_gib: 1.5}\n"
                 "train: {seq_len: 1024, micro_batch_size: 2, grad_accum_steps: 8}\n")
    res = runner.invoke(app, ["plan", str(f)], env=ENV)
    assert res.exit_code == 2 and "--margin" in res.output and "Traceback" not in res.output
