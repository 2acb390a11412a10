"""LoRA on MoE experts: transformers 5's fused experts under peft's ParamWrapper vs 4.x's per-expert linears.

Hand oracles for the adapter counts and the bytes the adapted expert stacks keep, a check of the
adapter count against peft itself on the meta device, and the trace's refusal of the 4.x layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vramplan.analytic.activations import ActContext, wrapped_experts
from vramplan.analytic.layout import LoraTargets, lora_targets, rank_params
from vramplan.catalog.resolve import resolve

MIXTRAL = "mistralai/Mixtral-8x7B-v0.1"


def _model(mid: str):  # type: ignore[no-untyped-def]
    return resolve({"model": mid, "hardware": {"gpu": "h100"}}).model


def _peft(targets: object = "all-linear", rank: int = 16):  # type: ignore[no-untyped-def]
    from vramplan.spec.scenario import Peft

    return Peft(method="lora", rank=rank, alpha=2 * rank, target_modules=targets)  # type: ignore[arg-type]


def test_mixtral_all_linear_adapter_count_transformers_5() -> None:
    # per layer (h = 4096, kv = 1024, I = 14336, E = 8, r = 16):
    #   q, o: 16 x (4096 + 4096) = 131,072 each; k, v: 16 x (4096 + 1024) = 81,920 each -> 425,984
    #   router (ParamWrapper, 2-D): 16 x (4096 + 8) = 65,664
    #   gate_up (rank 2r = 32 after peft's fusion): 32 x (4096 + 2 x 14336) x 8 = 8,388,608
    #   down: 16 x (14336 + 4096) x 8 = 2,359,296
    #   = 11,239,552 per layer x 32 layers = 359,665,664
    m = _model(MIXTRAL)
    lt = lora_targets(_peft(), m)
    assert lt == LoraTargets(linear=frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}), gate_up_rank=32,
                             down_rank=16, router_rank=16, expert_linears=False)
    assert rank_params(m, 1, 1, 1, 0, _peft(), lt).lora == 359_665_664


def test_mixtral_all_linear_adapter_count_transformers_4() -> None:
    # 4.x: per-expert lora.Linear on gate, up and down: 3 x 16 x (4096 + 14336) x 8 = 7,077,888, plus the
    # attention's 425,984 and the router Linear's 65,664 = 7,569,536 per layer x 32 = 242,225,152
    m = _model(MIXTRAL)
    lt = lora_targets(_peft(), m, fused_experts=False)
    assert not lt.experts_wrapped and "gate" in lt.linear and "down_proj" in lt.linear
    assert rank_params(m, 1, 1, 1, 0, _peft(), lt).lora == 242_225_152


def test_qlora_moe_keeps_per_expert_adapters() -> None:
    # bitsandbytes experts are per-expert 4-bit linears (4.x layout): adapted per expert, the router by ParamWrapper
    m = _model(MIXTRAL)
    lt = lora_targets(_peft(), m, quant="nf4")
    assert not lt.experts_wrapped and lt.router_rank == 16 and {"gate_proj", "up_proj", "down_proj"} <= lt.linear


def test_deepseek_dense_and_shared_mlps_lose_adapters() -> None:
    # peft moves gate_proj/up_proj/down_proj to target_parameters on Qwen2-MoE-style models, so the dense
    # first layer's MLP and the shared experts (nn.Linear of those names) are left without adapters
    m = _model("deepseek-ai/DeepSeek-V2-Lite")
    lt = lora_targets(_peft(["q_proj", "gate_proj", "up_proj", "down_proj"]), m)
    assert lt.linear == frozenset({"q_proj"}) and lt.gate_up_rank == 32 and lt.down_rank == 16
    assert lt.router_rank == 0


def test_gpt_oss_all_linear_is_attention_only() -> None:
    # gpt-oss's experts and router are not nn.Linear in either version: all-linear leaves them alone
    m = _model("openai/gpt-oss-20b")
    lt = lora_targets(_peft(), m)
    assert lt.linear == frozenset({"q_proj", "k_proj", "v_proj", "o_proj"}) and not lt.experts_wrapped


def test_wrapped_experts_bytes_worked_example() -> None:
    # Mixtral-8x7B, bf16 experts (w = 2), fp32 adapters, bf16 autocast:
    #   gate_up 2 x 8 x 28672 x 4096 = 1,879,048,192; casts 2 x 8 x 32 x (28672 + 4096) = 16,777,216
    #   down 2 x 8 x 4096 x 14336 = 939,524,096; casts 2 x 8 x 16 x (4096 + 14336) = 4,718,592
    #   router 2 x 8 x 4096 = 65,536 + half casts of A, B 2 x 16 x (4096 + 8) = 131,328
    m = _model(MIXTRAL)
    ctx = ActContext(compute_bytes=2, residual_bytes=2, linear_input_bytes=2, autocast=True, attention="flash",
                     gqa_repeat=False, seq_len=2048, frozen_base=True)
    wx = wrapped_experts(m, 32, 16, 16, 2, 4, ctx)
    assert (wx.gate_up, wx.gate_up_casts, wx.down, wx.down_casts, wx.router) == (
        1_879_048_192, 16_777_216, 939_524_096, 4_718_592, 196_864)
    assert wx.saved == 2_840_264_960
    # adapters already in the experts' dtype: the factors are views, nothing is copied
    assert wrapped_experts(m, 32, 16, 0, 2, 2, ctx).saved == 1_879_048_192 + 939_524_096


def test_fused_experts_cost_more_than_per_expert() -> None:
    # the adapted stacks kept from forward to backward: Mixtral all-linear LoRA needs far more on transformers 5
    doc = {"model": MIXTRAL, "hardware": {"gpu": "h200"},
           "train": {"micro_batch_size": 1, "seq_len": 2048,
                     "peft": {"method": "lora", "rank": 16, "target_modules": "all-linear"}}}
    from vramplan import estimate

    new = estimate(resolve(doc)).per_gpu.peak_allocated_bytes
    old = estimate(resolve({**doc, "software": {"transformers": "4.46"}})).per_gpu.peak_allocated_bytes
    # 32 layers x 2.84 GB of adapted stacks (test above) = 90.9 GB more, less what the 4.x per-expert
    # adapters save per token; measured by the traced engine at 198.5 GiB for transformers 5
    assert new - old > 85e9
    assert 190 * 2**30 < new < 205 * 2**30


def test_adapter_count_matches_peft() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from vramplan.trace.build import build_model
    from vramplan.trace.shrink import catalog_config, shrink

    for mid in (MIXTRAL, "Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-V3"):
        cfg = shrink(catalog_config(mid), vocab=2048)
        r = resolve({"model": cfg, "hardware": {"gpu": "a100"},
                     "train": {"peft": {"method": "lora", "rank": 8, "target_modules": "all-linear"}}})
        built = build_model(r, "meta", "train")
        got = sum(p.numel() for n, p in built.model.named_parameters() if "lora_" in n)
        want = rank_params(r.model, 1, 1, 1, 0, r.scenario.train.peft).lora
        assert got == want, mid


def test_trace_refuses_per_expert_layout(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import json

    from typer.testing import CliRunner

    from vramplan.cli.main import app
    from vramplan.trace.shrink import catalog_config, shrink

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(shrink(catalog_config(MIXTRAL), vocab=2048)))
    res = CliRunner().invoke(app, ["estimate", "--engine", "trace", "--model", str(cfg), "--gpu", "a100", "--peft", "lora",
                                   "--target-modules", "all-linear", "--transformers-version", "4.46"])
    assert res.exit_code == 2
    text = " ".join(res.output.split())
    assert "software.transformers" in text and "--engine analytic" in text and "cannot be traced" in text
    assert "Traceback" not in text
