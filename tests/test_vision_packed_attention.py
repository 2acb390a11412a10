"""Qwen2-VL's and Qwen2.5-VL's vision attention over the packed images before transformers 4.54
(facts/transformers.py ``QWEN_VL_PACKED_ATTENTION``, spec/vision.py ``packed_attention``): the frozen tower's forward
as a moment of the training step and of generate's prefill (analytic/inference.py ``tower_forward_bytes``), and a
trained tower's saved tensors of the release's kernel (analytic/terms/vision.py), each by hand."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.terms import StepContext
from vramplan.analytic.terms.vision import frozen_tower_forward_bytes, tower_sequence
from vramplan.catalog.resolve import resolve
from vramplan.facts.transformers import QWEN_VL_PACKED_ATTENTION, qwen_vl_packed_attention
from vramplan.spec.vision import packed_attention

MODEL = "Qwen/Qwen2.5-VL-3B-Instruct"


def _doc(release: str | None, peft: bool = True, attention: str = "sdpa", images: int = 2,
         task: str = "train") -> dict[str, Any]:
    doc: dict[str, Any] = {"model": MODEL, "task": task, "hardware": {"gpu": "A100-80GB"}}
    if task == "train":
        doc["train"] = {"images_per_sample": images, "image_size": 448, "micro_batch_size": 1, "seq_len": 1024,
                        "attention": attention, "precision": "bf16-mixed"}
        if peft:
            doc["train"]["peft"] = {"method": "lora"}
    else:
        doc["inference"] = {"images_per_sample": images, "image_size": 448, "prompt_len": 1024, "new_tokens": 8,
                            "attention": attention}
    if release:
        doc["software"] = {"transformers": release}
    return doc


@pytest.mark.parametrize(("release", "attention", "kernel", "bool_mask"), [
    ((4, 45), "sdpa", "math", True),        # Qwen2-VL's first release: 3-D q/k/v
    ((4, 49, 0), "sdpa", "math", True),     # Qwen2.5-VL's first
    ((4, 51, 3), "sdpa", "math", True),
    ((4, 52, 4), "sdpa", "efficient", True),  # q.unsqueeze(0): 4-D
    ((4, 53, 0), "sdpa", "efficient", False),  # [1, 1, S, S] in value's dtype
    ((4, 45, 0), "eager", "eager", False),
    ((4, 53, 3), "eager", "eager", False),
])
def test_release_rows(release: tuple[int, ...], attention: str, kernel: str, bool_mask: bool) -> None:
    row = qwen_vl_packed_attention(release, attention)
    assert row is not None and (row.kernel, row.bool_mask) == (kernel, bool_mask)


@pytest.mark.parametrize(("release", "attention"), [
    ((4, 54), "sdpa"), ((4, 54, 0), "eager"), ((5, 24), "sdpa"),  # per image from 4.54
    (None, "sdpa"),                                               # the current release
    ((4, 49), "flash"),                                           # varlen in every release
    ((4, 44, 2), "sdpa"),                                         # before Qwen2-VL existed (refused elsewhere)
])
def test_no_row(release: tuple[int, ...] | None, attention: str) -> None:
    assert qwen_vl_packed_attention(release, attention) is None


def test_rows_do_not_overlap() -> None:
    for attention in ("sdpa", "eager"):
        rows = sorted((r.first, r.last) for r in QWEN_VL_PACKED_ATTENTION if r.attention == attention)
        assert all(a[1] < b[0] for a, b in pairwise(rows))
        assert all(r.source for r in QWEN_VL_PACKED_ATTENTION)


def test_only_packing_towers_and_image_batches() -> None:
    assert packed_attention(resolve(_doc("4.49")).scenario, resolve(_doc("4.49")).model) is not None
    r = resolve(_doc("4.49", images=0))
    assert packed_attention(r.scenario, r.model) is None  # no image: no tower forward
    gemma = resolve({**_doc("4.50"), "model": "google/gemma-3-4b-it"})
    assert packed_attention(gemma.scenario, gemma.model) is None  # SigLIP attends within each image


# Qwen2.5-VL-3B's tower: hidden h = 1,280, 16 heads of 80 (q = 1,280), gated MLP I = 3,420 (three I-wide tensors:
# 10,260), RMSNorm; two 448 x 448 images of (448 / 14)^2 = 1,024 patches, S = 2,048; bf16 under autocast, c = 2.
# Common to every release: the rotary tables and positions (4 x 160 + 8 x 2 = 656 B a patch: 656 x 2,048 =
# 1,343,488) and the pixel values (3 channels x 2 frames x 14^2 = 1,176 a patch, c: 2 x 1,176 x 2,048 = 4,816,896):
# 6,160,384 B.
EXTRAS = 1_343_488 + 4_816_896


@pytest.mark.parametrize(("release", "expected"), [
    # per image (4.54, or unset): the MLP's moment, (3 h + 3 I) t c = 14,100 x 1,024 x 2 = 28,876,800 per image, x 2
    ("4.54", 2 * 28_876_800 + EXTRAS),
    (None, 2 * 28_876_800 + EXTRAS),
    # 4.49 SDPA, the math kernel over S: (2 h + q) t c = 3,840 x 4,096 = 15,728,640, the fp32 scaled q, k, v
    # 12 q t = 31,457,280, 9 B per score (fp32 scores and softmax, the bool row check) 9 x 16 x 2,048^2 =
    # 603,979,776: 651,165,696; the bool mask and SDPA's bf16 copy (1 + 2) x 2,048^2 = 12,582,912
    ("4.49", 651_165_696 + 12_582_912 + EXTRAS),
    # 4.52 SDPA, memory-efficient over S: the MLP's moment at t = 2,048, 14,100 x 4,096 = 57,753,600, with the bool
    # mask and its bf16 copy, 3 x 4,194,304 (rows of 2,048: aligned, no padded copy)
    ("4.52", 57_753_600 + 12_582_912 + EXTRAS),
    # 4.53: the mask built in bf16, 2 x 4,194,304 = 8,388,608
    ("4.53", 57_753_600 + 8_388_608 + EXTRAS),
])
def test_frozen_tower_forward_by_hand(release: str | None, expected: int) -> None:
    c = StepContext(resolve(_doc(release)), 0, "flash", False)
    assert frozen_tower_forward_bytes(c) == expected


def test_frozen_tower_forward_is_a_moment_of_the_step() -> None:
    # six 448 x 448 images, S = 6,144, LoRA with full checkpointing, seq_len 2,048 (6 x 256 image tokens and text):
    # the math kernel's running layer 3,840 x 6,144 x 2 + 12 x 1,280 x 6,144 + 9 x 16 x 6,144^2 = 47,185,920 +
    # 94,371,840 + 5,435,817,984 = 5,577,375,744, the masks 3 x 6,144^2 = 113,246,208, the rotary tables 656 x 6,144
    # = 4,030,464 and the pixels 2,352 x 6,144 = 14,450,688: 5,709,103,104 B of tower.  Beside it the step's resident
    # terms (the bf16 parameters, tower included, 7,516,618,752; the adapters' AdamW states 14,745,600; cuBLAS'
    # workspaces 17,039,360) and the text embeddings [1, 2,048, 2,048] in bf16, 8,388,608: the peak, before the
    # language model's first layer
    doc = _doc("4.49", images=6)
    doc["train"].update(seq_len=2048, gradient_checkpointing="full")
    rep = estimate(doc)
    assert rep.per_gpu.peak_phase == "forward"
    assert rep.per_gpu.breakdown_detail["activations"] == {"inputs_embeds (kept by the decoder's forward)": 8_388_608,
                                                           "vision tower": 5_709_103_104}
    assert rep.per_gpu.peak_allocated_bytes == 7_516_618_752 + 14_745_600 + 17_039_360 + 8_388_608 + 5_709_103_104
    assert any("attends over the micro-batch's 6,144 patches at once" in a for a in rep.assumptions)
    # from 4.54 each image attends alone: the tower's forward no longer peaks
    doc["software"] = {"transformers": "4.54"}
    new = estimate(doc)
    assert new.per_gpu.peak_phase != "forward" and not any("at once" in a for a in new.assumptions)


def test_trained_tower_saves_the_math_kernels_tensors() -> None:
    # full fine-tuning (tower trained), no checkpointing: per token and layer the tower's layer saves, under 4.54 per
    # image (flash): norm input 10,244 + qkv's input 2,560 + the fused qkv buffer 5,120 + q, k, v, output 4 x 2,560
    # + logsumexp 4 x 16 + post-attention norm 10,244 + gate/up's input (x2) 5,120 + the MLP's four I-wide tensors
    # 4 x 6,840 = 70,952 B; under 4.49 over S with the math kernel: the same less the fused buffer, q, k, v, output
    # and logsumexp (28,228 - 10,244 - 2,560 = 15,424 B) plus o_proj's input 2,560, the fp32 scaled q, k, v
    # 3 x 4 x 1,280 = 15,360 and the fp32 softmax 4 x 16 x 2,048 = 131,072: 204,520 B.  32 layers x 2,048 tokens:
    # (204,520 - 70,952) x 2,048 x 32 = 8,753,512,448 B more
    def saved(release: str) -> int:
        c = StepContext(resolve(_doc(release, peft=False)), 0, "flash", False)
        return sum(n for n, _ in tower_sequence(c))

    assert saved("4.49") - saved("4.54") == (204_520 - 70_952) * 2_048 * 32
    # 4.52: the memory-efficient kernel saves the flash set and each layer's bf16 mask 2 x 2,048^2 = 8,388,608
    assert saved("4.52") - saved("4.54") == 8_388_608 * 32
    # a trained tower's forward is recorded (no frozen-tower moment)
    c = StepContext(resolve(_doc("4.49", peft=False)), 0, "flash", False)
    assert frozen_tower_forward_bytes(c) == 0


def test_trained_tower_backward_over_the_pack_is_stated_and_widens_the_band() -> None:
    rep = estimate(_doc("4.49", peft=False))
    notes = [a for a in rep.assumptions if a.startswith("not modelled: the trained tower's backward over the pack")]
    # 8 x 16 x 2,048^2 B = 536,870,912 B = 0.50 GiB
    assert len(notes) == 1 and "0.50 GiB" in notes[0]
    assert any("band widened" in a for a in rep.assumptions)


def test_generate_prefill_counts_the_packed_tower() -> None:
    # generate's prefill moment holds the same tower bytes (test_frozen_tower_forward_by_hand, 4.49) beside the
    # kept text embeddings [1, 1,024, 2,048] in bf16 (4,194,304 B); from 4.54 the language model's running layer peaks
    old = estimate(_doc("4.49", task="inference"))
    assert old.per_gpu.peak_phase == "prefill"
    assert old.per_gpu.breakdown_detail["activations"] == {"inputs_embeds (kept by the decoder's forward)": 4_194_304,
                                                           "vision tower": 651_165_696 + 12_582_912 + EXTRAS}
    new = estimate(_doc("4.54", task="inference"))
    assert "vision tower" not in new.per_gpu.breakdown_detail["activations"]


def test_the_traced_engine_says_it_runs_the_installed_release() -> None:
    # the traced engine runs the installed transformers (per image): with an older release named it says what it does
    # not model, and the analytic engine counts
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as traced

    doc = _doc("4.49")
    rep = traced(doc)
    assert any(a.startswith("not modelled: transformers 4.49's vision attention over all the micro-batch's patches")
               for a in rep.assumptions)


def test_frozen_tower_eager_in_fp32_reads_fp32_scores() -> None:
    # fp32 training, eager, 4.49: the packed eager layer over S = 2,048 in fp32 (c = 4): (2 h + q) t c = 3,840 x 2,048
    # x 4 = 31,457,280, the scores and their softmax at 8 B per score (fp32 scores and fp32 output, no upcast copy)
    # 16 x 2,048^2 x 8 = 536,870,912, the fp32 mask 2,048^2 x 4 = 16,777,216; the rotary tables 1,343,488 and the fp32
    # pixels 2,048 x 1,176 x 4 = 9,633,792
    doc = _doc("4.49", attention="eager")
    doc["train"]["precision"] = "fp32"
    c = StepContext(resolve(doc), 0, "eager", False)
    assert frozen_tower_forward_bytes(c) == 31_457_280 + 536_870_912 + 16_777_216 + 1_343_488 + 9_633_792
