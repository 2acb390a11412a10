"""Activation checkpointing policies (analytic/checkpointing.py): full, every n-th layer, attention-core,
torchtitan's op-level SAC, and ``selective`` meaning the framework's own policy."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic import activations as act
from vramplan.analytic.checkpointing import checkpoint_policy, checkpointed_layer
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError


def _doc(framework: str = "torchtitan", model: str = "meta-llama/Llama-2-7b-hf", **train: Any) -> dict[str, Any]:
    return {"model": model, "framework": framework, "hardware": {"gpu": "H100"},
            "train": {"seq_len": 2048, "micro_batch_size": 1, "attention": "flash", **train}}


def test_selective_means_the_frameworks_policy() -> None:
    assert checkpoint_policy(resolve(_doc(gradient_checkpointing="selective")).scenario) == "op-sac"
    assert checkpoint_policy(resolve(_doc("hf-trainer", gradient_checkpointing="selective")).scenario) == \
        "attention-core"
    # the named policies give the same estimate as the word the framework resolves it to
    assert estimate(_doc("hf-trainer", gradient_checkpointing="selective")).per_gpu.peak_allocated_bytes == \
        estimate(_doc("hf-trainer", gradient_checkpointing="attention-core")).per_gpu.peak_allocated_bytes
    tt = estimate(_doc(gradient_checkpointing="selective"))
    assert tt.per_gpu.peak_allocated_bytes == estimate(_doc(gradient_checkpointing="op-sac")).per_gpu.peak_allocated_bytes
    assert any(a.startswith("gradient_checkpointing selective under torchtitan = op-sac") for a in tt.assumptions)


def test_op_sac_saves_every_other_matmul_and_the_attention_output() -> None:
    r = resolve(_doc(gradient_checkpointing="op-sac", precision="bf16-mixed"))
    c = StepContext(r, 0, "flash", 1)
    # Llama-2-7B (h 4096, I 11008, 32 heads): input 2h + q (1st mm) 2h + v (3rd) 2h + gate (5th) 2I
    # + down (7th) 2h + SDPA output 2h + fp32 logsumexp 4 x 32 = 5 x 8,192 + 22,016 + 128 = 63,104
    assert act.op_sac_saved_per_token(r.model, r.model.layers[0], c.act) == 63_104
    la = layer_activations(c)
    assert la.kept[0] == 63_104 * 2048 and la.kept[0] < la.full[0]


def test_every_nth_layer_is_checkpointed() -> None:
    s = resolve(_doc(gradient_checkpointing="full", checkpoint_every_n_layers=2)).scenario
    # torchtitan counts from 1 and wraps a layer when the count is a multiple of n: layers 1, 3, ... (0-based)
    assert [checkpointed_layer(s, j) for j in range(4)] == [False, True, False, True]
    c = StepContext(resolve(_doc(gradient_checkpointing="full", checkpoint_every_n_layers=2)), 0, "flash", 1)
    la = layer_activations(c)
    assert la.kept[0] == la.full[0] and la.kept[1] == 2 * 4096 * 2048  # the layer input, bf16
    # LoRA, so that the activations (not the optimizer step) make the peak
    peaks = [estimate(_doc("plain", gradient_checkpointing=g, checkpoint_every_n_layers=n, peft={"rank": 8}))
             .per_gpu.peak_allocated_bytes for g, n in [("full", 1), ("full", 2), ("none", 1)]]
    assert peaks[0] < peaks[1] < peaks[2]


@pytest.mark.parametrize(("doc", "field"), [
    (_doc("hf-trainer", gradient_checkpointing="full", checkpoint_every_n_layers=2), "checkpoint_every_n_layers"),
    (_doc(gradient_checkpointing="attention-core", checkpoint_every_n_layers=2), "checkpoint_every_n_layers"),
    (_doc("hf-trainer", gradient_checkpointing="op-sac"), "op-sac is torchtitan's"),
    (_doc(model="mistralai/Mixtral-8x7B-v0.1", gradient_checkpointing="selective"), "MoE layers"),
    (_doc("hf-trainer", gradient_checkpointing="full", deepspeed_checkpointing="partition"), "needs framework deepspeed"),
])
def test_policies_a_framework_cannot_run_are_refused(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError, match=field):
        resolve(doc)


def test_the_trace_checkpoints_every_nth_layer() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as trace_estimate

    doc = {"model": "Qwen/Qwen2.5-0.5B", "framework": "plain", "hardware": {"gpu": "H100"},
           "train": {"seq_len": 1024, "micro_batch_size": 4, "gradient_checkpointing": "full",
                     "checkpoint_every_n_layers": 2}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, trace_estimate(doc).per_gpu.peak_allocated_bytes
    assert abs(a / t - 1) < 0.005  # measured 2026-11: 17,569,192,448 vs 17,569,153,536
    with pytest.raises(ScenarioError, match="not traced"):
        trace_estimate(_doc(gradient_checkpointing="op-sac"))


def test_deepspeed_partitioned_and_cpu_checkpointing() -> None:
    def doc(mode: str) -> dict[str, Any]:
        return {"model": "meta-llama/Llama-2-7b-hf", "framework": "deepspeed",
                "hardware": {"gpu": "A100-80GB", "num_gpus": 8}, "parallel": {"tp": 2, "zero_stage": 1},
                "train": {"seq_len": 4096, "micro_batch_size": 4, "gradient_checkpointing": "full",
                          "deepspeed_checkpointing": mode}}
    none, part, cpu = (estimate(doc(x)) for x in ("none", "partition", "partition+cpu"))
    # each of the 32 layer inputs is 4 x 4096 tokens x 4096 x 2 B = 134,217,728 B; partition keeps half (tp 2)
    # on the device, partition+cpu keeps that half on the host: 32 x 67,108,864 = 2,147,483,648 B
    assert none.per_gpu.phases["forward"] - part.per_gpu.phases["forward"] == 2_147_483_648
    assert part.per_gpu.phases["forward"] - cpu.per_gpu.phases["forward"] == 2_147_483_648
    assert (none.host.offloaded_bytes, cpu.host.offloaded_bytes) == (0, 2_147_483_648)
    assert any("DeepSpeed partition+cpu" in a for a in cpu.assumptions)
