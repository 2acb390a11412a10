"""train.torchao_cpu_offload: torchao's CPUOffloadOptimizer (analytic/terms/cpu_offload.py) and its refusals.

Llama-2-7B, bf16-true, one GPU: 6,738,415,616 parameters; minimal_size = 4096 keeps the tensors *below* 4096
elements on the GPU, and its smallest (the norm weights) have exactly 4096, so every tensor is offloaded.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.terms.base import bytes_of
from vramplan.analytic.terms.cpu_offload import MINIMAL_SIZE
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError


def scenario(mode: str, **train: Any) -> dict[str, Any]:
    t = {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-true", "optimizer": "adamw",
         "gradient_checkpointing": "full", "torchao_cpu_offload": mode, **train}
    return {"model": "meta-llama/Llama-2-7b-hf", "task": "train", "hardware": {"gpu": "RTX-4090", "num_gpus": 1},
            "framework": "plain", "train": t}


def test_host_and_device_bytes_by_hand() -> None:
    assert MINIMAL_SIZE == 4096
    terms = train_step(resolve(scenario("optimizer"))).terms
    # every tensor has at least 4096 elements (the norms exactly 4096): nothing stays on the GPU but the weights
    assert bytes_of(terms, "optimizer.states") == 0
    # AdamW's exp_avg and exp_avg_sq in bf16 on the host: 2 x 2 x 6,738,415,616 = 26,953,662,464 B
    assert bytes_of(terms, "optimizer.states.offloaded", where="host") == 26_953_662_464
    # pinned copies, each rounded up to a power of two: per layer 4 x 2^25 (q, k, v, o: 2 x 16,777,216 B = 2^25)
    # + 3 x 2^27 (MLP: 90,177,536 B -> 134,217,728) + 2 x 2^13 (norms: 8192 B); embedding and head 262,144,000 B
    # -> 2^28 each; the final norm 2^13: 32 x (134,217,728 + 402,653,184 + 16,384) + 2 x 268,435,456 + 8,192
    # = 17,180,393,472 + 536,870,912 + 8,192
    per_layer = 4 * 2**25 + 3 * 2**27 + 2 * 2**13
    pinned = 32 * per_layer + 2 * 2**28 + 2**13
    assert pinned == 17_717_272_576
    assert bytes_of(terms, "parameters.pinned_host", where="host") == pinned
    assert bytes_of(terms, "gradients.pinned_host", where="host") == pinned
    # no GPU step temporaries (fused AdamW, on the CPU)
    assert bytes_of(terms, "optimizer.step") == 0


def test_offload_gradients_frees_them_in_the_backward() -> None:
    base, opt, grads = (estimate(scenario(m)).per_gpu for m in ("none", "optimizer", "optimizer+gradients"))
    # the states leave the GPU: 2 x 12.55 GiB of states and the foreach temporary
    assert opt.peak_allocated_bytes < base.peak_allocated_bytes
    assert opt.breakdown["optimizer_states"] == 0
    # the gradients leave it too: one tensor's at a time (an MLP matrix, 90,177,536 B, at layer 0's backward)
    assert grads.peak_allocated_bytes < opt.peak_allocated_bytes
    assert grads.breakdown["gradients"] <= 90_177_536 + 262_152_192
    assert estimate(scenario("optimizer+gradients")).fits


@pytest.mark.parametrize(("train", "said"), [
    ({"grad_accum_steps": 2}, "gradient accumulation"),
    ({"optimizer": "lion"}, "AdamW"),
    ({"peft": {"method": "lora", "rank": 8}}, "peft"),
])
def test_refusals(train: dict[str, Any], said: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        resolve(scenario("optimizer+gradients", **train))
    assert "train.torchao_cpu_offload" in str(exc.value) and said in str(exc.value)


def test_refused_on_two_gpus_and_with_a_clipping_framework() -> None:
    two = scenario("optimizer")
    two["hardware"] = {"gpu": "RTX-4090", "num_gpus": 2}
    with pytest.raises(ScenarioError, match="single-GPU"):
        resolve(two)
    clip = scenario("optimizer+gradients")
    clip["framework"] = "hf-trainer"
    with pytest.raises(ScenarioError, match="max_grad_norm"):
        resolve(clip)
    clip["train"]["torchao_cpu_offload"] = "optimizer"  # the GPU gradients stay: the Trainer can clip them
    assert resolve(clip).scenario.train.torchao_cpu_offload == "optimizer"
