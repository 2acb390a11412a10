"""Tensor parallelism traced through transformers' tp_plan on DTensor (trace/tensor.py).

The shrunken models have hidden 512 or 1024, head dimension 64, 2 layers and vocab 2048; the
KV heads divide by tp (transformers' plan splits whole heads).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate as analytic_estimate
from vramplan.errors import ScenarioError
from vramplan.spec.load import Resolved
from vramplan.trace.engine import estimate, trace
from vramplan.trace.parallel import apply_parallel
from vramplan.trace.report import peak_of
from vramplan.trace.shrink import catalog_config, shrink
from vramplan.trace.step import StepTrace

FAMILIES = {"llama": "meta-llama/Llama-3.1-8B", "mistral": "mistralai/Mistral-7B-v0.1", "qwen2": "Qwen/Qwen2.5-7B",
            "mixtral": "mistralai/Mixtral-8x7B-v0.1", "qwen3_moe": "Qwen/Qwen3-30B-A3B"}
DENSE = ("llama", "mistral", "qwen2")


def _scenario(fam: str = "llama", tp: int = 2, hidden: int = 512, kv: int | None = None,
              train: dict[str, Any] | None = None, **extra: Any) -> Resolved:
    cfg = shrink(catalog_config(FAMILIES[fam]), vocab=2048, hidden=hidden)
    if kv is not None:
        cfg["num_key_value_heads"] = kv
    doc: dict[str, Any] = {"model": cfg, "hardware": {"gpu": "a100", "num_gpus": tp}, "parallel": {"tp": tp},
                           "train": {"micro_batch_size": 2, "seq_len": 512, **(train or {})}}
    doc.update(extra)
    return resolve(doc)


def _persistent(st: StepTrace, category: str) -> int:
    start = next(seq for seq, ph in st.marks if ph == "forward")
    return sum(ev.nbytes for ev in st.events[:start] if ev.nbytes > 0 and ev.category == category)


def test_rank_weights_are_the_tp_shards() -> None:
    # Llama shrunk to hidden 512: 8 heads of 64, 2 KV heads, intermediate 1792, vocab 2048, 2 layers.
    # tp=2, one rank (fp32 parameters under bf16-mixed):
    #   q 512*512/2 = 131,072   k, v 128*512/2 = 32,768 each   o 512*512/2 = 131,072
    #   gate, up, down 1792*512/2 = 458,752 each   two norms 2*512 = 1,024 (replicated)
    #   per layer 262,144 + 65,536 + 1,376,256 + 1,024 = 1,704,960; two layers 3,409,920
    #   embedding and LM head 2048*512/2 = 524,288 each (vocabulary rows); final norm 512
    #   total 3,409,920 + 1,048,576 + 512 = 4,459,008 parameters = 17,836,032 B
    _, st = trace(_scenario())
    assert st.tensor_parallel == 2
    assert _persistent(st, "weights") == 4_459_008 * 4 == 17_836_032
    assert _persistent(st, "optimizer_states") == 2 * 17_836_032  # AdamW exp_avg + exp_avg_sq, local shards
    # gradients: every parameter's local shard, except the embedding's, which DTensor's embedding
    # backward leaves replicated: + 2048*512/2 = 524,288 more elements (fp32) = 2,097,152 B
    grads = sum(ev.nbytes for ev in st.events if ev.nbytes > 0 and ev.category == "gradients")
    assert grads == 17_836_032 + 2_097_152


def test_collectives_allocate_their_outputs() -> None:
    # forward, b=2, s=512, h=512: the embedding's all-reduce (fp32 lookup: 2*512*512*4 = 2 MiB), each
    # layer's o_proj and down_proj all-reduce (bf16 under autocast: 2*512*512*2 = 1 MiB each, 4 in all)
    # and the LM head's all-gather of the bf16 logits (tp*b, s, V/tp) = 2*2*512*1024*2 = 4 MiB
    _, st = trace(_scenario())
    start = next(seq for seq, ph in st.marks if ph == "forward")
    end = next(seq for seq, ph in st.marks if ph == "backward")
    fwd = [ev for ev in st.events[start:end] if ev.nbytes > 0 and "_c10d_functional" in ev.op]
    reduces = sorted(ev.nbytes for ev in fwd if "all_reduce" in ev.op)
    gathers = [ev.nbytes for ev in fwd if "all_gather" in ev.op]
    assert reduces == [2**20] * 4 + [2 * 2**20]
    assert gathers == [4 * 2**20]
    # no second copy from the AsyncCollectiveTensor wrapping (it shares the output's storage on a GPU)
    assert not any("wrap_tensor" in ev.op or "wait_tensor" in ev.op for ev in st.events)


ROWS: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = [
    *[(fam, tp, {}, {}) for fam in DENSE for tp in (2, 4)],
    # MoE: transformers' moe_tp_experts plan splits every expert's intermediate width over the ranks
    # (packed_colwise gate_up, rowwise down), so each rank runs all routed tokens through I/tp
    ("mixtral", 2, {}, {}), ("qwen3_moe", 2, {}, {}),
    ("llama", 2, {"gradient_checkpointing": "full"}, {}),
    ("llama", 2, {"precision": "bf16-true"}, {}),
    ("mistral", 4, {"optimizer": "sgd-momentum"}, {}),
    ("llama", 2, {}, {"hardware": {"gpu": "a100", "num_gpus": 4}}),  # DDP across two tp groups
    ("llama", 4, {}, {"task": "inference", "inference": {"batch_size": 4, "prompt_len": 512, "new_tokens": 64}}),
    ("qwen2", 2, {}, {"task": "inference", "inference": {"batch_size": 4, "prompt_len": 512, "new_tokens": 64}}),
]


@pytest.mark.parametrize(("fam", "tp", "train", "extra"), ROWS)
def test_analytic_matches_trace(fam: str, tp: int, train: dict[str, Any], extra: dict[str, Any]) -> None:
    # hidden 1024: 16 heads, 4 KV heads (Qwen2's 7:1 ratio would leave 2: set to 4)
    doc_extra = {"hardware": {"gpu": "a100", "num_gpus": tp}, **extra}
    r = _scenario(fam, tp, hidden=1024, kv=4, train=train, **doc_extra)
    r, st = trace(r)
    events, marks, *_ = apply_parallel(r, st)
    ws = cublas_workspace_bytes(r.gpu, handles=2 if r.scenario.task == "train" else 1)
    t = peak_of(events, marks).raw_bytes - ws
    a = analytic_estimate(r).per_gpu.peak_allocated_bytes - ws
    assert abs(a / t - 1) <= 0.03, (t, a)


def test_report_counts_the_tp_communicator() -> None:
    rep = estimate(_scenario())
    assert any("tp_plan" in a for a in rep.assumptions)
    one = estimate(_scenario(tp=1, hardware={"gpu": "a100", "num_gpus": 1}))
    assert rep.per_gpu.peak_allocated_bytes < one.per_gpu.peak_allocated_bytes


@pytest.mark.parametrize(("par", "needle"), [
    ({"pp": 2}, "pipeline, context and expert parallelism are not traced"),
    ({"cp": 2}, "pipeline, context and expert parallelism are not traced"),
    ({"tp": 2, "pp": 2}, "pipeline, context and expert parallelism are not traced"),
    ({"tp": 4}, "do not divide by tp=4"),  # 8 heads, 2 KV heads
    ({"tp": 2, "sequence_parallel": True}, "sequence parallelism is not traced"),
])
def test_refused(par: dict[str, Any], needle: str) -> None:
    r = _scenario(hardware={"gpu": "a100", "num_gpus": 8}, parallel=par)
    with pytest.raises(ScenarioError, match=needle):
        trace(r)


def test_deepspeed_and_torchtitan_tp_refused() -> None:
    for fw in ("deepspeed", "torchtitan"):
        with pytest.raises(ScenarioError, match="tensor parallelism is not traced"):
            trace(_scenario(framework=fw))


def test_patches_do_not_leak() -> None:
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import _dispatch

    wrap = funcol._maybe_wrap_tensor
    dispatch: Any = _dispatch
    redistribute = dispatch.redistribute_local_tensor
    trace(_scenario())
    assert funcol._maybe_wrap_tensor is wrap
    assert dispatch.redistribute_local_tensor is redistribute
    assert not dist.is_initialized()


def test_a_model_tensor_parallelism_cannot_trace_is_refused_with_its_reason() -> None:
    # a tied head under transformers 5.24's apply_tensor_parallelism: named_parameters() drops the tied
    # 'lm_head.weight', so the plan's entry is looked up as a module and raises KeyError; the trace answers with a
    # ScenarioError naming the model and the cause (the CLI exits 2 with it), never the library's traceback
    cfg = shrink(catalog_config("meta-llama/Llama-3.2-1B"), vocab=2048, hidden=512)
    assert cfg.get("tie_word_embeddings")
    r = resolve({"model": cfg, "task": "inference", "hardware": {"gpu": "a100", "num_gpus": 2}, "parallel": {"tp": 2},
                 "inference": {"batch_size": 1, "prompt_len": 8, "new_tokens": 4, "dtype": "bf16"}})
    with pytest.raises(ScenarioError, match=r"tensor parallelism could not be traced .*KeyError: 'lm_head.weight'"):
        trace(r)
