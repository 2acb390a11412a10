"""TRL's SFTTrainer loss by release (facts/trl.py SFT_LOSS_ROWS, analytic/trl_sft.py): hand-computed oracles."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.train import train_step
from vramplan.analytic.trl_sft import chunked_nll_loss_tensors, sft_fused_loss_tensors
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError
from vramplan.facts.trl import SFT_LOSS_ROWS, sft_loss_row

V = 50_257   # GPT-2's vocabulary


def _gpt2(trl: str | None, precision: str = "fp32", batch: int = 2, gpus: int = 1, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model": "openai-community/gpt2", "task": "train", "framework": "hf-trainer",
        "hardware": {"gpu": "A100-80GB", "num_gpus": gpus},
        "train": {"micro_batch_size": batch, "seq_len": 128, "precision": precision, "optimizer": "adamw",
                  "gradient_checkpointing": "none", "attention": "sdpa"},
        "software": {"trl": trl} if trl else {}, "offline": True}
    doc.update(over)
    return doc


def _term(doc: dict[str, Any], name: str) -> int:
    return sum(t.nbytes for t in train_step(resolve(doc)).terms if t.name == name)


@pytest.mark.parametrize("row", SFT_LOSS_ROWS, ids=[".".join(map(str, r.first)) for r in SFT_LOSS_ROWS])
def test_each_row_holds_from_its_release_and_cites_its_source(row) -> None:  # type: ignore[no-untyped-def]
    assert sft_loss_row(row.first) is row
    assert row.sources.startswith("trl ")
    # the copies of the logits exist only on the logits path
    assert row.path == "logits" or (row.copies == 0 and not row.gather and not row.entropy_rows)


def test_fp32_copy_exceeds_the_loss_peak() -> None:
    # fp32, b = 2, s = 128 (256 positions), trl 0.16 (one copy): at the loss the logits 4 x 256 V and the saved
    # log-probs 4 x 256 V (no upcast copy in fp32): 2,048 V; at the metrics the same plus the copy 4 x 2 x 127 V =
    # 1,016 V: 1,016 x 50,257 = 51,061,112 B above
    assert _term(_gpt2("0.16.0"), "logits.trl_sft_metrics") == 1_016 * V == 51_061_112


def test_half_copy_stays_below_the_loss_peak() -> None:
    # bf16-mixed: the loss's peak holds 2 + 4 (upcast) + 4 (log-probs) bytes per position and entry, the metrics'
    # moment 2 + 4 + 2 (the upcast is freed): no record, and the estimate is the HF Trainer's
    assert _term(_gpt2("0.16.0", "bf16-mixed"), "logits.trl_sft_metrics") == 0
    with_trl = estimate(resolve(_gpt2("0.16.0", "bf16-mixed"))).per_gpu.peak_allocated_bytes
    assert with_trl == estimate(resolve(_gpt2(None, "bf16-mixed"))).per_gpu.peak_allocated_bytes


def test_release_0_22_entropy_per_sequence() -> None:
    # bf16-mixed, b = 1 (the copy is a view), s = 128: at the loss 2 + 4 + 4 = 10 x 128 V = 1,280 V; at the entropy
    # 2 x 128 V (logits) + 4 x 128 V (log-probs) + 3 x 128 V x 2 (log_softmax, exp, product) = 1,536 V:
    # 256 V = 12,865,792 B above
    assert _term(_gpt2("0.22.0", "bf16-mixed", batch=1), "logits.trl_sft_metrics") == 256 * V == 12_865_792
    # 0.23 chunks the entropy by 128 rows of the flattened logits: nothing above the loss's peak
    assert _term(_gpt2("0.23.0", "bf16-mixed", batch=1), "logits.trl_sft_metrics") == 0


def test_release_0_15_0_gathers_the_copies_of_every_rank() -> None:
    # 4 ranks (DDP), bf16-mixed, b = 2: the copy 2 x 2 x 127 V = 508 V and the gathered 4 x 508 V = 2,032 V beside
    # the logits 512 V and the log-probs 1,024 V: 4,076 V against the loss's 512 + 1,024 + 1,024 = 2,560 V:
    # 1,516 V = 76,189,612 B above; 0.15.1 gathers only the token counts
    assert _term(_gpt2("0.15.0", "bf16-mixed", gpus=4), "logits.trl_sft_metrics") == 1_516 * V == 76_189_612
    assert _term(_gpt2("0.15.1", "bf16-mixed", gpus=4), "logits.trl_sft_metrics") == 0


def test_releases_1_3_to_1_5_hold_two_copies() -> None:
    # fp32, b = 2: two copies 2 x 1,016 V above the loss's 2,048 V moment ... moment 4,080 V: 2,032 V above
    assert _term(_gpt2("1.4.0"), "logits.trl_sft_metrics") == 2_032 * V
    assert _term(_gpt2("1.6.0"), "logits.trl_sft_metrics") == 1_016 * V


def test_chunked_nll_formula() -> None:
    # b (s - 1) = 254 positions (one chunk, fewer than 256), H = 768, fp32 hidden and head (no weight copy),
    # trainable head: saved 254 x 768 x 4 = 780,288; forward 4 x 254 x V x 4 = 204,244,448; backward that + the
    # chunk's logit gradient 254 x V x 4 = 51,061,112 + the head's fp32 gradient V x 768 x 4 = 154,389,504 + the
    # hidden gradient 780,288 = 410,475,352
    kt = chunked_nll_loss_tensors(254, V, 768, 4, 4, True, True)
    assert (kt.saved, kt.forward_extra, kt.backward_extra) == (780_288, 204_244_448, 410_475_352)
    # a bf16 head before 1.13 is copied to fp32 for each chunk (V x 768 x 4); from 1.13 cast to the hidden dtype
    assert chunked_nll_loss_tensors(254, V, 768, 4, 2, True, True).forward_extra == 204_244_448 + V * 768 * 4
    assert chunked_nll_loss_tensors(254, V, 768, 2, 2, True, False).forward_extra == 204_244_448


def test_chunked_and_fused_releases_drop_the_logits() -> None:
    # Qwen2.5-7B LoRA, b = 4 x 2,048, bf16-mixed: the HF Trainer's loss holds 10 bytes x 8,192 x 152,064 at its
    # peak (12.5e9 B); chunked_nll (1.10) and the fused head (1.16) hold none of it
    doc = {"model": "Qwen/Qwen2.5-7B-Instruct", "task": "train", "framework": "hf-trainer",
           "hardware": {"gpu": "H100-SXM", "num_gpus": 1},
           "train": {"micro_batch_size": 4, "seq_len": 2048, "precision": "bf16-mixed", "optimizer": "adamw",
                     "gradient_checkpointing": "full", "peft": {"method": "lora"}}, "offline": True}
    hf = estimate(resolve(doc)).per_gpu.peak_allocated_bytes
    chunked = estimate(resolve({**doc, "software": {"trl": "1.10.0"}}))
    fused = estimate(resolve({**doc, "software": {"trl": "1.16.0"}}))
    assert hf - chunked.per_gpu.peak_allocated_bytes > 8 * 10**9
    assert hf - fused.per_gpu.peak_allocated_bytes > 8 * 10**9
    assert any("chunked_nll" in a for a in chunked.assumptions)
    assert any("fused LM head" in a for a in fused.assumptions)


def test_fused_head_outputs() -> None:
    # N = 254 positions: the saved hidden states 254 x 768 x 4 and 16 bytes each (targets, log_z, entropy), the
    # outputs 13 bytes each (log_probs, entropy, is_top1, per-token loss) beside the kernel's 7 fp32 statistics and
    # its tile 254 x 32,768 x 2 (bf16 compute; fp32 hidden and head cast per chunk: 32,768 x 768 x 2 and 254 x 768 x 2)
    kt = sft_fused_loss_tensors(254, V, 768, 4, 2, 4, True)
    tiles = 254 * 32_768 * 2 + 32_768 * 768 * 2 + 254 * 768 * 2
    assert kt.saved == 254 * 768 * 4 + 16 * 254
    assert kt.forward_extra == max(7 * 4 * 254 + tiles, 13 * 254)


def test_software_trl_not_read_outside_the_hf_trainer_sft_step() -> None:
    rep = estimate(resolve(_gpt2("0.16.0", framework="accelerate")))
    assert any(a.startswith("software.trl set but not used") for a in rep.assumptions)
    rep = estimate(resolve(_gpt2("0.16.0")))
    assert not any(a.startswith("software.trl set but not used") for a in rep.assumptions)


def test_trace_refuses_trl_sft_from_0_15() -> None:
    from vramplan.trace import engine as trace_engine

    with pytest.raises(ScenarioError, match="SFTTrainer's loss is not traced"):
        trace_engine.estimate(resolve(_gpt2("0.16.0")))
