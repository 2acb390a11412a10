"""Context parallelism joins the sharding group: ZeRO, FSDP and Megatron-LM's distributed optimizer shard the model
over data-parallel x context-parallel ranks (``Scenario.shard_degree``; torchtitan's ``dp_shard_cp`` mesh, Megatron's
dp-cp group, DeepSpeed's ``seq_data_parallel_group``), and the cp group holds an NCCL communicator of its own.

Llama-2-7B: 6,738,415,616 parameters (embedding and head untied).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.terms.context import communicators
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.validate.rules import model_state_shards

LLAMA2_7B = 6_738_415_616
STATES = ("weights", "gradients", "optimizer_states", "master_weights")


def _doc(framework: str, gpus: int, cp: int, **parallel: Any) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-2-7b-hf", "task": "train", "framework": framework,
            "hardware": {"gpu": "H100-SXM", "num_gpus": gpus},
            "train": {"optimizer": "adamw", "micro_batch_size": 1, "seq_len": 4096, "precision": "bf16-mixed",
                      "gradient_checkpointing": "full", "attention": "flash"},
            "parallel": {"cp": cp, **parallel}}


def _states(doc: dict[str, Any]) -> dict[str, int]:
    b = estimate(doc).to_json_dict()["per_gpu"]["breakdown"]
    return {k: b[k] for k in STATES}


@pytest.mark.parametrize(("gpus", "cp", "dp", "shard"), [(8, 1, 8, 8), (8, 2, 4, 8), (8, 8, 1, 8), (16, 4, 4, 16)])
def test_shard_degree_is_dp_times_cp(gpus: int, cp: int, dp: int, shard: int) -> None:
    s = resolve(_doc("torchtitan", gpus, cp, fsdp="full_shard")).scenario
    assert (s.data_parallel_degree, s.shard_degree) == (dp, shard)


def test_deepspeed_zero3_ulysses_shards_over_every_rank() -> None:
    # DeepSpeed ZeRO-3 with sequence parallelism 4 on 4 GPUs (dp 1): ZeRO partitions over seq_data_parallel_group,
    # all 4 ranks.  Optimizer states: fp32 Adam moments 8 B x ceil(6,738,415,616 / 4) = 8 x 1,684,603,904
    # = 13,476,831,232; master weights 4 x 1,684,603,904 = 6,738,415,616.  Before, dp 1 left ZeRO-3 unsharded
    # (8 x 6,738,415,616 = 53,907,324,928 of moments on every rank).
    got = _states(_doc("deepspeed", 4, 4, zero_stage=3))
    assert got["optimizer_states"] == 13_476_831_232
    assert got["master_weights"] == 6_738_415_616


def test_torchtitan_fsdp_over_dp_shard_cp_equals_pure_data_parallel_states() -> None:
    # 8 GPUs: cp 2 x dp 4 shards the model states over 8 ranks, exactly as dp 8 does (torchtitan's dp_shard_cp)
    with_cp = _states(_doc("torchtitan", 8, 2, fsdp="full_shard"))
    without = _states(_doc("torchtitan", 8, 1, fsdp="full_shard"))
    # (weights and gradients at the peak moment hold gathered units and in-flight gradients, which depend on the
    # tokens per rank; the sharded states do not)
    assert (with_cp["optimizer_states"], with_cp["master_weights"]) == \
        (without["optimizer_states"], without["master_weights"])
    # Adam's moments: 8 B x ceil(6,738,415,616 / 8) = 8 x 842,301,952 = 6,738,415,616
    assert with_cp["optimizer_states"] == 6_738_415_616


def test_megatron_distributed_optimizer_shards_over_dp_cp() -> None:
    # tp 1, cp 2, dp 4 on 8 GPUs, --use-distributed-optimizer: main parameters and moments over dp x cp = 8 ranks:
    # fp32 main 4 x 6,738,415,616 / 8 = 3,369,207,808; moments 8 x 6,738,415,616 / 8 = 6,738,415,616
    doc = _doc("megatron", 8, 2, megatron={"use_distributed_optimizer": True})
    doc["train"]["optimizer"] = "adamw-fused"
    doc["train"]["gradient_checkpointing"] = "none"
    got = _states(doc)
    assert got["master_weights"] == 3_369_207_808
    assert got["optimizer_states"] == 6_738_415_616


def test_cp_group_is_a_communicator_and_reduces_with_dp() -> None:
    # cp 8 on 8 GPUs: dp 1, but gradients are reduced over the 8 ranks (one communicator) and the cp group is
    # another: 2.  cp 1 on 8 GPUs: the data-parallel group only: 1.  One GPU: none.
    assert communicators(resolve(_doc("torchtitan", 8, 8, fsdp="full_shard")).scenario) == 2
    assert communicators(resolve(_doc("torchtitan", 8, 1, fsdp="full_shard")).scenario) == 1
    assert communicators(resolve(_doc("torchtitan", 1, 1)).scenario) == 0


def test_rule_of_thumb_shards_over_cp_too() -> None:
    # validate/rules.py S: ZeRO-1+ over dp x cp = 2 x 2 = 4 GPUs (tp = pp = 1)
    assert model_state_shards(resolve(_doc("deepspeed", 4, 2, zero_stage=1))) == 4


def test_report_says_what_cp_splits_and_joins_and_what_it_leaves_out() -> None:
    r = estimate(_doc("deepspeed", 4, 4, zero_stage=3))
    said = [a for a in r.assumptions if a.startswith("context parallelism (cp 4)")]
    assert len(said) == 1
    assert "1024 of every sequence's 4096 tokens" in said[0]
    assert "dp x cp = 1 x 4 = 4 ranks" in said[0]
    assert any(a.startswith("not modelled: context parallelism's exchange buffers") for a in r.assumptions)
    assert not any("context parallelism" in a for a in estimate(_doc("deepspeed", 4, 1, zero_stage=3)).assumptions)
