"""The training step's memory terms (analytic/terms), checked against hand-computed bytes on GPT-2 small.

GPT-2 small: 124,439,808 parameters (V = 50,257, h = 768, 12 layers, 1,024 positions, tied embedding);
outside the layers: wte 50,257 x 768 = 38,597,376, wpe 1,024 x 768 = 786,432, ln_f 2 x 768 = 1,536,
together 39,385,344.
"""

from __future__ import annotations

from typing import Any

from vramplan import estimate
from vramplan.analytic.moment import K
from vramplan.analytic.terms import StepContext, static_bytes, step_terms
from vramplan.analytic.terms import gradients as grad_terms
from vramplan.analytic.terms import loss as loss_terms
from vramplan.analytic.terms import resident as resident_terms
from vramplan.analytic.terms.base import Term, totals
from vramplan.analytic.timeline import END, FORWARD, STEP, TIED_EMBEDDING, attention, mlp
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.spec.load import Resolved

GPT2 = 124_439_808


def _resolved(gpus: int = 1, precision: str = "fp32", train: dict[str, Any] | None = None,
              parallel: dict[str, Any] | None = None, **top: Any) -> Resolved:
    doc: dict[str, Any] = {
        "model": "gpt2", "task": "train", "hardware": {"gpu": "A100-80GB", "num_gpus": gpus},
        "train": {"micro_batch_size": 1, "seq_len": 1024, "precision": precision, "optimizer": "adamw",
                  **(train or {})},
        "parallel": parallel or {}, **top}
    return resolve(doc)


def _ctx(**kw: Any) -> StepContext:
    return StepContext(_resolved(**kw), 0, "flash", False)


def _named(terms: list[Term], name: str) -> list[Term]:
    return [t for t in terms if t.name == name]


def test_parameters_resident_and_sharded() -> None:
    c = _ctx()
    assert c.rp.total == GPT2
    # fp32: 4 B each, 124,439,808 x 4 = 497,759,232 B for the whole step
    (t,) = resident_terms.parameters(c)
    assert (t.key, t.nbytes, t.born, t.dies, t.where) == (K.PARAMETERS, 497_759_232, FORWARD, END, "device")
    # FSDP full_shard over 4 GPUs: 124,439,808 / 4 = 31,109,952 parameters x 4 B = 124,439,808 B
    (t,) = resident_terms.parameters(_ctx(gpus=4, parallel={"fsdp": "full_shard"}))
    assert t.nbytes == 124_439_808


def test_offloaded_terms_live_on_nvme() -> None:
    # ZeRO-3 + optimizer and parameter offload to NVMe, 4 GPUs, fp32: this rank's partition is
    # 31,109,952 parameters: parameters 4 B each (124,439,808 B), AdamW's two fp32 moments
    # (248,879,616 B) and fp32 gradients (124,439,808 B), none on the GPU
    c = _ctx(gpus=4, parallel={"zero_stage": 3, "offload": "optimizer+params", "offload_device": "nvme"},
             framework="deepspeed")
    terms = step_terms(c)
    off = {t.name: t.nbytes for t in terms if t.where == "nvme" and t.nbytes}
    assert off == {"parameters.offloaded": 124_439_808, "optimizer.states.offloaded": 248_879_616,
                   "gradients.fp32.offloaded": 124_439_808}
    assert totals(t for t in terms if t.where == "device")["parameters"] == 0
    assert sum(t.nbytes for t in terms if t.key is K.GRADIENTS and t.where == "device") == 0


def test_ddp_buckets_only_under_ddp() -> None:
    # DDP over 2 GPUs keeps a second fp32 copy of every gradient: 124,439,808 x 4 = 497,759,232 B
    assert resident_terms.ddp_buckets(_ctx(gpus=2))[0].nbytes == 497_759_232
    # one GPU: no reducer; ZeRO-1 replaces DDP: no buckets
    assert resident_terms.ddp_buckets(_ctx())[0].nbytes == 0
    assert resident_terms.ddp_buckets(_ctx(gpus=2, parallel={"zero_stage": 1}, framework="deepspeed"))[0].nbytes == 0


def test_gradients_grow_layer_by_layer_and_sum_to_all() -> None:
    c = _ctx()
    terms = grad_terms.gradients(c)
    # all of them: 124,439,808 x 4 = 497,759,232 B
    assert sum(t.nbytes for t in terms) == 497_759_232
    # the tied embedding gets its gradient at the LM head, first: all 39,385,344 outside parameters
    # x 4 B = 157,541,376 B from the last layer's MLP backward on
    (head,) = _named(terms, "gradients.head")
    assert (head.nbytes, head.born) == (157_541_376, mlp(11))
    # a GPT-2 layer: 7,087,872 parameters x 4 B = 28,351,488 B, split between the MLP part and the
    # attention part of its backward
    layer5 = [t for t in terms if t.name == "gradients.layer" and t.layer == 5]
    assert sum(t.nbytes for t in layer5) == 28_351_488
    assert {t.born for t in layer5} <= {mlp(5), attention(5)}
    # gradient accumulation: every gradient exists from the forward on
    assert {t.born for t in grad_terms.gradients(_ctx(train={"grad_accum_steps": 2}))} == {FORWARD}


def test_tied_embedding_contributions() -> None:
    # fp32: the head's contribution is a transposed view, summed out of place: 2 extra V x h buffers,
    # 2 x 50,257 x 768 x 4 = 308,779,008 B (gradients.tied_embedding_accumulation_bytes)
    (t,) = grad_terms.tied_embedding(_ctx())
    assert (t.nbytes, t.born, t.dies) == (308_779_008, TIED_EMBEDDING, STEP)
    # bf16 autocast: the cast's gradient is fresh, summed in place: 1 buffer, 154,389,504 B
    assert grad_terms.tied_embedding(_ctx(precision="bf16-mixed"))[0].nbytes == 154_389_504


def test_loss_terms_and_their_tensors() -> None:
    # bf16-mixed, 1 x 1024 tokens: v = 1024 x 50,257 = 51,463,168; the forward holds the bf16 logits
    # (2v = 102,926,336), their fp32 copy (4v = 205,852,672) and the saved log-softmax (4v): 10v
    # = 514,631,680 B; the backward's start 12v = 617,558,016 B
    fwd, bwd = loss_terms.loss(_ctx(precision="bf16-mixed"))
    assert fwd.tensors == (102_926_336, 205_852_672, 205_852_672)
    assert (fwd.key, fwd.nbytes) == (K.LOSS_FORWARD, 514_631_680)
    assert (bwd.key, bwd.nbytes) == (K.LOSS_BACKWARD, 617_558_016)


def test_static_bytes_is_the_floor_of_every_moment() -> None:
    r = _resolved()
    # parameters 497,759,232 + AdamW's two fp32 moments 995,518,464 + two cuBLAS workspaces on an
    # A100 (2 x 8,519,680 = 17,039,360; analytic/overhead.py) = 1,510,317,056
    assert static_bytes(r) == 1_510_317_056
    tr = train_step(r)
    assert all(mo.total >= static_bytes(r) for mo in tr.moments)
    assert estimate(r).per_gpu.peak_allocated_bytes >= static_bytes(r)


def test_train_result_carries_the_terms_the_moments_come_from() -> None:
    tr = train_step(_resolved())
    # the optimizer step's moment: every static term, all gradients and the step's temporaries
    step = tr.moments[-1]
    assert step.phase == "optimizer"
    assert step.total == sum(t.nbytes for t in tr.terms if t.where == "device" and t.dies is END
                             and (t.born is FORWARD or t.key is K.GRADIENTS or t.born is STEP))
