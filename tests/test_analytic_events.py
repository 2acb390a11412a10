"""The analytic event stream (analytic/events.py) replayed through the allocator model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vramplan.alloc import replay
from vramplan.analytic import activations as act
from vramplan.analytic import events
from vramplan.analytic.events import split_exact, train_run_events
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_split_sums_exactly() -> None:
    # 10 over three equal weights: 3 + 3 + 4 (the last takes the rounding)
    assert split_exact(10, [1, 1, 1]) == [3, 3, 4]


def test_stream_peak_allocated_matches_closed_form() -> None:
    # Llama-2-7B, bf16-mixed AdamW, no checkpointing: the stream holds the closed-form terms split into
    # tensors, so its allocated peak (512-byte rounding, unsplit blocks, the forward's short-lived
    # temporaries) is within 0.5% of the closed form (146.46 vs 146.41 GiB when written).
    tr = train_step(resolve(EXAMPLES / "llama2-7b-full-naive-a100.yaml"))
    assert tr.layout is not None
    res = replay(train_run_events(tr.layout))
    assert abs(res.peak_allocated_bytes / tr.peak.total - 1) < 0.005
    # reserved >= allocated, and fragmentation is counted: more than the 2 MiB segment rounding
    assert res.peak_reserved_bytes > res.peak_allocated_bytes + 64 * 2**20


def _doc(model: str, gpu: str = "H100-80GB", n: int = 1, framework: str | None = None,
         parallel: dict[str, Any] | None = None, **train: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": model, "task": "train", "hardware": {"gpu": gpu, "num_gpus": n},
                           "train": {"micro_batch_size": 2, "seq_len": 512, **train}, "parallel": parallel or {}}
    if framework:
        doc["framework"] = framework
    return doc


_LORA_ALL = {"method": "lora", "rank": 16, "target_modules": "all-linear"}
# families (dense, MoE, MLA, sinks, sandwich norms, parallel residual, encoder, GPT-2's dropout), PEFT methods
# (LoRA, QLoRA, DoRA, LoRA on fused experts, a frozen prefix under eager attention) and checkpointing policies
SPREAD: dict[str, Any] = {
    "llama7-none": EXAMPLES / "llama2-7b-full-naive-a100.yaml",
    "llama7-zero3-full": EXAMPLES / "llama2-7b-zero3-ckpt-8xa100.yaml",
    "lora-llama8": EXAMPLES / "lora-llama3-8b-a10g.yaml",
    "qlora-llama7": EXAMPLES / "qlora-7b-rtx4090.yaml",
    "gpt2-eager-fp32": EXAMPLES / "gpt2-eager-fp32-t4.yaml",
    "mixtral-zero3": _doc("mistralai/Mixtral-8x7B-v0.1", n=8, framework="deepspeed", parallel={"zero_stage": 3}),
    "qwen3moe-lora-experts": _doc("Qwen/Qwen3-30B-A3B", n=8, framework="deepspeed", parallel={"zero_stage": 3},
                                  peft=_LORA_ALL),
    "deepseek-v2-lite-full": _doc("deepseek-ai/DeepSeek-V2-Lite", n=8, framework="deepspeed",
                                  parallel={"zero_stage": 3}, gradient_checkpointing="full"),
    "gpt-oss-eager-selective": _doc("openai/gpt-oss-20b", n=8, framework="deepspeed", parallel={"zero_stage": 3},
                                    attention="eager", gradient_checkpointing="selective"),
    "gemma2-eager-selective": _doc("google/gemma-2-2b", attention="eager", gradient_checkpointing="selective"),
    "gemma3-sdpa": _doc("google/gemma-3-1b-pt"),
    "pythia-eager": _doc("EleutherAI/pythia-410m-deduped", attention="eager"),
    "bert-full": _doc("google-bert/bert-large-uncased", gradient_checkpointing="full"),
    "dora-llama7-eager-prefix": _doc("meta-llama/Llama-2-7b-hf", attention="eager",
                                     peft={"method": "dora", "rank": 8, "target_modules": ["q_proj", "v_proj"]}),
    "llama8-torchtitan-op-sac": _doc("meta-llama/Meta-Llama-3-8B", n=8, framework="torchtitan",
                                     parallel={"fsdp": "full_shard"}, gradient_checkpointing="selective"),
    "llama8-every-2nd-layer": _doc("meta-llama/Meta-Llama-3-8B", n=8, framework="torchtitan",
                                   parallel={"fsdp": "full_shard"}, gradient_checkpointing="full",
                                   checkpoint_every_n_layers=2),
}


def _live_after(stream: list[int]) -> int:
    """Bytes still allocated at the end of a compact stream (``n > 0`` allocates the next id, ``-id - 1`` frees)."""
    sizes: list[int] = []
    live: set[int] = set()
    for x in stream:
        if x > 0:
            live.add(len(sizes))
            sizes.append(x)
        else:
            live.discard(-x - 1)
    return sum(sizes[i] for i in live)


@pytest.mark.parametrize("name", sorted(SPREAD))
def test_layer_events_are_the_closed_form_records(name: str) -> None:
    """Each layer's saved-tensor allocations are the closed form's records: they sum to the layer's saved bytes
    on the timeline (the ``saved.kept`` + ``saved.recompute`` terms) exactly, a recording forward leaves exactly
    those bytes (and the weight casts) allocated, a checkpointed one its ``kept`` bytes, and no tensor
    reconciles the two."""
    tr = train_step(resolve(SPREAD[name]))
    lay, c = tr.layout, tr.context
    assert lay is not None and isinstance(c, StepContext)
    la = layer_activations(c)
    assert not hasattr(events, "reconcile")
    for j, lt in enumerate(lay.layers):
        assert sum(lt.saved) == lt.full == la.full[j], (name, j)
        assert act.total_bytes(la.tensors[j]) == la.full[j]
        assert all(x >= 0 for x in lt.saved)
        assert len(lt.saved) == sum(t.copies for t in la.tensors[j])
        assert not any("filler" in t.name or "reconcil" in t.name for t in la.tensors[j])
        plan = events._layer_plan(lay, lt)
        st = events._Stream()
        events._forward_layer(st, plan, record=True)
        assert _live_after(st.events) == lt.full + lt.weight_cast, (name, j)
        if lt.checkpointed:
            st = events._Stream()
            events._forward_layer(st, plan, record=False)
            assert _live_after(st.events) == lt.kept, (name, j)


def test_spread_covers_the_policies_and_methods() -> None:
    """The spread above reaches what it claims: a checkpointed and a recording layer in one stage (every 2nd
    layer), a frozen-prefix layer (its input norm not saved), DoRA's and the wrapped experts' records."""
    lay = train_step(resolve(SPREAD["llama8-every-2nd-layer"])).layout
    assert lay is not None
    assert [lt.checkpointed for lt in lay.layers[:4]] == [False, True, False, True]
    c = train_step(resolve(SPREAD["dora-llama7-eager-prefix"])).context
    assert isinstance(c, StepContext)
    first, second = layer_activations(c).tensors[:2]
    names0, names1 = {t.name for t in first}, {t.name for t in second}
    assert "dora.scaled_outputs" in names0 and "dora.identity" in names1
    # layer 0's input does not require grad: its input norm keeps nothing, and with LoRA on q and v (not k)
    # q @ k^T keeps no query (the key's gradient is not needed): activations.frozen_input_eager_dropped
    assert "norm.input" not in names0 and "norm.input" in names1
    assert "attention.q" not in names0 and "attention.q" in names1
    c = train_step(resolve(SPREAD["qwen3moe-lora-experts"])).context
    assert isinstance(c, StepContext)
    assert any(t.name.startswith("experts.adapted_") for t in layer_activations(c).tensors[-1])


def test_llama_layer_records_worked_example() -> None:
    """analytic/activations.py's worked example, record by record: Llama-2-7B, bf16-mixed (fp32 residual),
    SDPA flash, full fine-tuning, h = 4096, I = 11008, 32 heads: 227,464 B per token per layer."""
    r = resolve(EXAMPLES / "llama2-7b-full-naive-a100.yaml")
    c = StepContext(r, 0, "flash", False)
    ls = c.layer_specs[0]
    got = {t.name: (t.nbytes, t.copies, t.part) for t in act.layer_tensors(c.m, ls, c.act)}
    assert got == {
        "norm.input": (8 * 4096 + 4, 1, "attention"),  # fp32 x + fp32 normalized + fp32 rsqrt: 32,772
        "attention.qkv.input_cast": (2 * 4096, 3, "attention"),  # one bf16 cast per projection: 24,576
        "attention.q": (2 * 4096, 1, "attention"),  # q, k, v as the kernel saves them: 3 x 8,192
        "attention.k": (2 * 4096, 1, "attention"),
        "attention.v": (2 * 4096, 1, "attention"),
        "attention.output": (2 * 4096, 1, "attention"),  # 8,192 (o_proj's input is a view of it)
        "attention.logsumexp": (4 * 32, 1, "attention"),  # 128
        "norm.post_attention": (8 * 4096 + 4, 1, "mlp"),  # 32,772
        "mlp.gate_up.input_cast": (2 * 4096, 2, "mlp"),  # 16,384
        "mlp.gate_output": (2 * 11008, 1, "mlp"),  # gate, SiLU, up outputs and the product: 4 x 22,016
        "mlp.act_output": (2 * 11008, 1, "mlp"),
        "mlp.up_output": (2 * 11008, 1, "mlp"),
        "mlp.down.input": (2 * 11008, 1, "mlp"),
    }
    # 32,772 + 24,576 + 24,576 + 8,192 + 128 + 32,772 + 16,384 + 88,064 = 227,464
    assert act.total_bytes(act.layer_tensors(c.m, ls, c.act)) == act.layer_saved_per_token(c.m, ls, c.act) == 227_464
