"""torchtitan's FSDP2 units in the analytic engine (analytic/terms/sharding.py, gradients.py
``fsdp2_reduce_scatter``), checked against hand-computed bytes on Llama 3.1 8B over 8 GPUs, bf16-mixed.

Llama 3.1 8B: h = 4096, 32 layers, V = 128,256, 8 KV heads of 128 (kv width 1024), MLP 14,336, untied head.
One block: 4096 x (4096 + 1024 + 1024 + 4096) + 3 x 4096 x 14,336 + 2 x 4096
= 41,943,040 + 176,160,768 + 8,192 = 218,112,000 parameters.
Root unit: embedding 128,256 x 4096 = 525,336,576, head the same, final norm 4096:
1,050,677,248 parameters; the head's share (head + final norm) 525,340,672.
"""

from __future__ import annotations

from typing import Any

from vramplan import estimate
from vramplan.analytic.allocator import train_reserved_bytes
from vramplan.analytic.moment import K
from vramplan.analytic.terms import StepContext, sharding, step_terms
from vramplan.analytic.terms import gradients as grad_terms
from vramplan.analytic.terms.base import Term
from vramplan.analytic.timeline import END, FORWARD, STEP, TIED_EMBEDDING, layer_done, mlp, sweep
from vramplan.analytic.train import stage_timeline, train_step
from vramplan.catalog.resolve import resolve

BLOCK = 218_112_000
ROOT = 1_050_677_248
HEAD = 525_340_672
EMBEDDING = 525_336_576
LAYERS = 32


def _ctx(framework: str = "torchtitan", checkpointing: str = "full", **parallel: Any) -> StepContext:
    doc: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B", "task": "train", "framework": framework,
        "hardware": {"gpu": "H100-SXM", "num_gpus": 8},
        "train": {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-mixed", "optimizer": "adamw",
                  "gradient_checkpointing": checkpointing, "attention": "flash"},
        "parallel": {"fsdp": "full_shard", **parallel}}
    return StepContext(resolve(doc), 0, "flash", False)


def _named(terms: list[Term], prefix: str) -> list[Term]:
    return [t for t in terms if t.name.startswith(prefix)]


def test_block_reduce_scatter_input_is_fp32_and_kept_until_the_next_block() -> None:
    c = _ctx()
    rs = _named(grad_terms.fsdp2_reduce_scatter(c), "fsdp2.reduce_scatter_input")
    blocks = [t for t in rs if t.layer >= 0]
    assert len(blocks) == LAYERS
    # 4 B (fp32 reduce dtype) x 218,112,000 = 872,448,000
    assert {t.nbytes for t in blocks} == {872_448_000}
    by_layer = {t.layer: t for t in blocks}
    assert (by_layer[31].born, by_layer[31].dies) == (layer_done(31), layer_done(30))
    assert (by_layer[0].born, by_layer[0].dies) == (layer_done(0), TIED_EMBEDDING)


def test_block_unsharded_gradients_are_in_param_dtype() -> None:
    # bf16 param_dtype: 2 B x 218,112,000 = 436,224,000 (the sharded gradient's 4 B would give 872,448,000)
    terms = grad_terms.unsharded_gradients(_ctx())
    assert {t.nbytes for t in terms} == {436_224_000}
    # outside torchtitan the record keeps the gradient dtype (fp32 under FSDP's mixed precision)
    assert {t.nbytes for t in grad_terms.unsharded_gradients(_ctx("accelerate"))} == {872_448_000}


def test_root_unit_gradients_and_reduce_scatter() -> None:
    c = _ctx()
    terms = grad_terms.fsdp2_reduce_scatter(c)
    head, = _named(terms, "fsdp2.root_unsharded.head")
    emb, = _named(terms, "fsdp2.root_unsharded.embedding")
    root, = _named(terms, "fsdp2.reduce_scatter_input.root")
    assert (head.nbytes, head.born, head.dies) == (2 * HEAD, mlp(LAYERS - 1), STEP)  # 1,050,681,344
    assert (emb.nbytes, emb.born, emb.dies) == (2 * EMBEDDING, TIED_EMBEDDING, STEP)  # 1,050,673,152
    assert (root.nbytes, root.born, root.dies) == (4 * ROOT, TIED_EMBEDDING, STEP)  # 4,202,708,992
    resharded, = sharding.root_resharded(c)
    assert (resharded.nbytes, resharded.born, resharded.dies) == (-2 * ROOT, TIED_EMBEDDING, END)


def test_gathered_blocks_one_at_the_loss_two_in_the_backward() -> None:
    c = _ctx()
    first, second = sharding.gathered(c)
    assert first.nbytes == second.nbytes == 2 * BLOCK  # 436,224,000
    assert (first.born, first.dies) == (FORWARD, TIED_EMBEDDING)
    assert (second.born, second.dies) == (mlp(LAYERS - 1), TIED_EMBEDDING)
    # elsewhere: two units for the whole step, one record
    generic, = sharding.gathered(_ctx("accelerate"))
    assert (generic.nbytes, generic.born, generic.dies) == (4 * BLOCK, FORWARD, STEP)


def test_moments_at_the_loss_a_block_and_the_root_reduce() -> None:
    c = _ctx()
    moments = sweep(step_terms(c), stage_timeline(c))
    phases = [(pt.loc.at, pt.loc.layer) for pt in stage_timeline(c).points]
    loss = moments[phases.index(("loss", -1))]
    block = moments[phases.index(("mlp", 30))]
    root = moments[phases.index(("embedding", -1))]
    step = moments[phases.index(("step", -1))]
    assert loss.get(K.GATHERED) == 2 * BLOCK
    # layer 30's backward: its own bf16 gradients (436,224,000) + the head's (1,050,681,344); layer 31's fp32 input
    assert block.get(K.UNSHARDED_GRADS) == 2 * BLOCK + 2 * HEAD
    assert block.get(K.REDUCE_SCATTER_INPUT) == 4 * BLOCK
    assert block.get(K.GATHERED) == 4 * BLOCK
    # the root's reduce: its bf16 gradients 2,101,354,496 beside its fp32 input 4,202,708,992; no unit gathered,
    # the root resharded; the sharded gradients are the blocks' only: 32 x 218,112,000 x 4 / 8 = 3,489,792,000
    assert root.get(K.UNSHARDED_GRADS) == 2 * ROOT
    assert root.get(K.REDUCE_SCATTER_INPUT) == 4 * ROOT
    assert root.get(K.GATHERED) == 0 and root.get(K.GATHERED_ROOT) == 0
    assert root.get(K.GRADIENTS) == LAYERS * BLOCK * 4 // 8
    # the optimizer step: every sharded gradient, 8,030,261,248 parameters x 4 / 8, nothing gathered
    assert step.get(K.GRADIENTS) == 8_030_261_248 * 4 // 8 and step.get(K.GATHERED_ROOT) == 0


def test_not_torchtitan_or_not_sharded_is_unchanged() -> None:
    for c in (_ctx("accelerate"), _ctx(fsdp="none")):
        assert grad_terms.fsdp2_reduce_scatter(c) == [] and sharding.root_resharded(c) == []
        assert not grad_terms.has_root_reduce_point(c)


def _ctx_v2(**kw: Any) -> StepContext:
    doc: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B", "task": "train", "framework": "torchtitan",
        "hardware": {"gpu": "H100-SXM", "num_gpus": 8}, "software": {"torchtitan": "0.2.0"},
        "train": {"micro_batch_size": 1, "seq_len": 2048, "precision": "bf16-mixed", "optimizer": "adamw",
                  "gradient_checkpointing": "full", "attention": "flash"},
        "parallel": {"fsdp": "full_shard"}, **kw}
    return StepContext(resolve(doc), 0, "flash", False)


def test_v02_embedding_and_head_units() -> None:
    c = _ctx_v2()
    assert sharding.root_gathered(c) == [] and sharding.root_resharded(c) == []
    head, emb = sharding.split_units_gathered(c)
    # [norm, output]: 2 x 525,340,672 = 1,050,681,344 B from the forward to the last block's backward
    assert (head.nbytes, head.born, head.dies) == (2 * HEAD, FORWARD, mlp(LAYERS - 1))
    # the embedding: 2 x 525,336,576 = 1,050,673,152 B, prefetched by the first block's backward, to its own reduce
    assert (emb.nbytes, emb.born, emb.dies) == (2 * EMBEDDING, mlp(0), TIED_EMBEDDING)
    current, prefetched = sharding.gathered(c)
    assert (current.born, current.dies) == (mlp(LAYERS - 1), TIED_EMBEDDING)
    assert (prefetched.born, prefetched.dies) == (mlp(LAYERS - 1), mlp(0))
    terms = grad_terms.fsdp2_reduce_scatter(c)
    head_rs, = _named(terms, "fsdp2.reduce_scatter_input.head")
    # 4 x 525,340,672 = 2,101,362,688 B, kept through the last block's backward
    assert (head_rs.nbytes, head_rs.born, head_rs.dies) == (4 * HEAD, mlp(LAYERS - 1), layer_done(LAYERS - 1))
    emb_rs, = _named(terms, "fsdp2.reduce_scatter_input.embedding")
    assert (emb_rs.nbytes, emb_rs.born, emb_rs.dies) == (4 * EMBEDDING, TIED_EMBEDDING, STEP)  # 2,101,346,304
    assert _named(terms, "fsdp2.root_unsharded.head") == []


def test_v02_moments() -> None:
    c = _ctx_v2()
    moments = sweep(step_terms(c), stage_timeline(c))
    phases = [(pt.loc.at, pt.loc.layer) for pt in stage_timeline(c).points]
    loss = moments[phases.index(("loss", -1))]
    last = moments[phases.index(("mlp", LAYERS - 1))]
    first = moments[phases.index(("mlp", 0))]
    emb = moments[phases.index(("embedding", -1))]
    # at the loss: the head's unit only, no block
    assert loss.get(K.GATHERED_ROOT) == 2 * HEAD and loss.get(K.GATHERED) == 0
    # the last block's backward: two blocks, the head's fp32 input, the block's bf16 gradients; the head resharded
    assert last.get(K.GATHERED) == 4 * BLOCK and last.get(K.GATHERED_ROOT) == 0
    assert last.get(K.REDUCE_SCATTER_INPUT) == 4 * HEAD and last.get(K.UNSHARDED_GRADS) == 2 * BLOCK
    # the first block's backward: itself and the prefetched embedding
    assert first.get(K.GATHERED) == 2 * BLOCK and first.get(K.GATHERED_ROOT) == 2 * EMBEDDING
    # the embedding's reduce: its bf16 gradient beside its fp32 input, 6 x 525,336,576 = 3,152,019,456 B; sharded
    # gradients of the blocks and the head: (32 x 218,112,000 + 525,340,672) x 4 / 8 = 3,752,462,336
    assert emb.get(K.UNSHARDED_GRADS) + emb.get(K.REDUCE_SCATTER_INPUT) == 6 * EMBEDDING
    assert emb.get(K.GATHERED) == emb.get(K.GATHERED_ROOT) == 0
    assert emb.get(K.GRADIENTS) == (LAYERS * BLOCK + HEAD) * 4 // 8


def test_v02_tied_model_keeps_one_unit() -> None:
    # a tied model (Llama 3.2 1B) wraps [tok_embeddings, norm, lm_head] as one unit, as the v0.1 root
    c = _ctx_v2(model="meta-llama/Llama-3.2-1B")
    assert not sharding.split_units(c) and sharding.root_resharded(c) != []


def test_the_replay_agrees_with_the_timeline_at_the_loss() -> None:
    # Llama 3.1 8B, 8192 tokens, full checkpointing: the step peaks at the loss's backward (12 x 128,256 x 8192 B of
    # logits gradients), where the event stream holds what the timeline does: one block (v0.1) or none (v0.2)
    # gathered, and no reduce-scatter buffer; to within the allocator's rounding (0.1 %)
    for software in ({}, {"torchtitan": "0.2.0"}):
        doc: dict[str, Any] = {
            "model": "meta-llama/Llama-3.1-8B", "task": "train", "framework": "torchtitan",
            "hardware": {"gpu": "H100-SXM", "num_gpus": 8}, "software": software,
            "train": {"micro_batch_size": 1, "seq_len": 8192, "precision": "bf16-mixed", "optimizer": "adamw",
                      "gradient_checkpointing": "full", "attention": "flash"},
            "parallel": {"fsdp": "full_shard"}}
        tr = train_step(resolve(doc))
        assert tr.layout is not None and tr.peak.get(K.LOSS_BACKWARD) > 0
        allocated, _ = train_reserved_bytes(tr.layout)
        assert abs(allocated - tr.peak.total) <= 0.001 * tr.peak.total, (software, allocated, tr.peak.total)


def test_assumptions_name_the_layout_and_an_unused_release() -> None:
    base: dict[str, Any] = {"model": "meta-llama/Llama-3.1-8B", "task": "train", "framework": "torchtitan",
                            "hardware": {"gpu": "H100-SXM", "num_gpus": 8}, "parallel": {"fsdp": "full_shard"},
                            "train": {"micro_batch_size": 1, "seq_len": 2048}}
    v01 = estimate(base).assumptions
    assert any(a.startswith("torchtitan FSDP2 units as apply_fsdp made them up to v0.1") for a in v01)
    v02 = estimate({**base, "software": {"torchtitan": "0.2.0"}}).assumptions
    assert any(a.startswith("torchtitan 0.2.0 FSDP2 units (apply_fsdp_to_decoder") for a in v02)
    other = estimate({**base, "framework": "accelerate", "software": {"torchtitan": "0.2.0"}}).assumptions
    assert any(a.startswith("software.torchtitan set but not used") for a in other)
    assert not any("FSDP2 units" in a for a in other)


def _doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": "meta-llama/Llama-3.1-8B", "task": "train", "framework": "torchtitan",
                           "hardware": {"gpu": "H100-SXM", "num_gpus": 8}, "parallel": {"fsdp": "full_shard"},
                           "train": {"micro_batch_size": 1, "seq_len": 2048}}
    doc.update(over)
    return doc


def test_tied_weight_gradient_is_counted_once() -> None:
    # Llama 3.2 1B (tied): the root unit's unsharded gradient (param dtype) holds both contributions of the tied
    # weight, and the root's fp32 reduce-scatter input follows it; no second accumulation term at the embedding
    doc = _doc(model="meta-llama/Llama-3.2-1B")
    terms = step_terms(StepContext(resolve(doc), 0, "flash", False))
    assert [t for t in terms if t.name == "gradients.tied_embedding"] == []
    assert [t for t in terms if t.name.startswith("fsdp2.root_unsharded")] != []
    # the same model under accelerate's FSDP keeps the generic accumulation term
    generic = step_terms(StepContext(resolve({**doc, "framework": "accelerate"}), 0, "flash", False))
    assert [t for t in generic if t.name == "gradients.tied_embedding"] != []


def test_notes_follow_the_layout_that_is_counted() -> None:
    one_gpu = estimate(_doc(hardware={"gpu": "H100-SXM", "num_gpus": 1}, software={"torchtitan": "0.2.0"}))
    assert not any("FSDP2 units" in a for a in one_gpu.assumptions)
    assert any(a.startswith("software.torchtitan set but not used") for a in one_gpu.assumptions)
    offload = estimate(_doc(parallel={"fsdp": "full_shard", "offload": "optimizer"}))
    assert any(a.startswith("not modelled: torchtitan's FSDP2 units with CPU offload") for a in offload.assumptions)
    tied = estimate(_doc(model="meta-llama/Llama-3.2-1B", software={"torchtitan": "0.2.0"}))
    assert any(a.startswith("torchtitan 0.2.0 FSDP2 units on a tied model") for a in tied.assumptions)


def test_torchtitan_with_a_zero_stage_is_refused() -> None:
    import pytest

    from vramplan.errors import ScenarioError

    with pytest.raises(ScenarioError) as exc:
        estimate(_doc(parallel={"zero_stage": 3}))
    assert "parallel.zero_stage" in [p.where for p in exc.value.problems]
