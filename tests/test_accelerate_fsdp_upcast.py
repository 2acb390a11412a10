"""accelerate's FSDP upcast: half-precision trainable weights under FSDP with the Trainer's --bf16 are held in fp32.

accelerate >= 0.30.0 ``Accelerator.prepare_model`` (PR huggingface/accelerate#2674) upcasts each FSDP unit's
trainable flat parameter to fp32 when mixed precision is set; FSDP2's ``fsdp2_prepare_model`` does the same
(facts/accelerate.py).  The gradients (a gradient has its parameter's dtype) and AdamW's moments follow.
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.catalog.resolve import resolve
from vramplan.facts.accelerate import FSDP_UPCAST_RELEASE

# Llama-2-7B: 6,738,415,616 parameters (the catalog's count, transformers' module on the meta device)
P = 6_738_415_616


def _doc(**train: Any) -> dict[str, Any]:
    software = train.pop("software", {})
    framework = train.pop("framework", "hf-trainer")
    parallel = train.pop("parallel", {"fsdp": "full_shard"})
    return {"model": "meta-llama/Llama-2-7b-hf", "hardware": {"gpu": "A100-80GB", "num_gpus": 4},
            "framework": framework, "parallel": parallel, "software": software,
            "train": {"micro_batch_size": 1, "seq_len": 512, "precision": "bf16-true",
                      "gradient_checkpointing": "full", **train}}


def test_upcast_doubles_sharded_gradients_and_moments() -> None:
    up = estimate(_doc()).per_gpu.breakdown
    # fp32 gradients sharded over 4 ranks: P x 4 B / 4 = 6,738,415,616; AdamW's two fp32 moments: P x 8 / 4
    assert up["gradients"] == P * 4 // 4 == 6_738_415_616
    assert up["optimizer_states"] == P * 8 // 4 == 13_476_831_232
    off = estimate(_doc(trainer_mixed_precision=False)).per_gpu.breakdown
    # mixed_precision "no": bf16 gradients P x 2 / 4 = 3,369,207,808; bf16 moments P x 4 / 4
    assert off["gradients"] == P * 2 // 4 == 3_369_207_808
    assert off["optimizer_states"] == P * 4 // 4 == 6_738_415_616
    # the sharded fp32 parameters: P x 4 / 4 more than the bf16 shard (P x 2 / 4) in the weights term
    assert up["weights"] - off["weights"] == P * 2 // 4


def test_the_report_says_so_and_holds_the_precision_that_runs() -> None:
    rep = estimate(_doc(framework="accelerate"))
    assert rep.scenario["train"]["precision"] == "bf16-mixed"
    assert any("upcasts the trainable parameters to fp32" in a and "0.30" in a for a in rep.assumptions)
    # the report's scenario resolves to itself
    assert resolve(rep.scenario).scenario.train.precision == "bf16-mixed"
    fp16 = estimate({**_doc(precision="fp16-true"), "hardware": {"gpu": "V100-32GB", "num_gpus": 4}})
    assert fp16.scenario["train"]["precision"] == "fp16-mixed"


@pytest.mark.parametrize("case", [
    {"trainer_mixed_precision": False},                                         # mixed_precision "no"
    {"software": {"accelerate": "0.29.3"}},                                     # before PR #2674
    {"software": {"transformers": "4.29.2"}},                                   # the Trainer wrapped FSDP itself
    {"framework": "accelerate", "software": {"accelerate": "1.13.0"}},          # FSDP2 of 1.13 casts nothing
    {"parallel": {"fsdp": "none"}},                                             # no FSDP unit to upcast
    {"framework": "deepspeed", "parallel": {"zero_stage": 3}},                  # DeepSpeed's own fp32 masters
    {"framework": "plain"},                                                     # a loop without accelerate
    {"peft": {"method": "lora", "rank": 8, "target_modules": ["q_proj", "v_proj"]}},  # fp32 adapters already
], ids=["flag-off", "accelerate-0.29", "transformers-4.29", "fsdp2-1.13", "no-fsdp", "deepspeed", "plain", "peft"])
def test_where_it_does_not_apply(case: dict[str, Any]) -> None:
    doc = _doc(**dict(case))
    r = resolve(doc)
    assert r.scenario.train.precision == "bf16-true"
    assert not any("upcasts the trainable parameters" in n for n in r.assumptions)


def test_the_fsdp1_boundaries_hold_under_the_trainer() -> None:
    # the Trainer through accelerate from transformers 4.30, accelerate from 0.30.0; FSDP1 upcasts at 1.13 too
    for software in ({"transformers": "4.30.0"}, {"accelerate": "1.13.0"}, {"accelerate": "0.30.0"}):
        assert resolve(_doc(software=software)).scenario.train.precision == "bf16-mixed", software


def test_peft_under_accelerate_fsdp2_on_1_6_to_1_12_is_stated_not_modelled() -> None:
    # fsdp2_prepare_model of accelerate 1.6-1.12 runs model.to(torch.float32): the frozen base too, not modelled;
    # the note starts with "not modelled: ", which widens the band (report/band.py)
    peft = {"method": "lora", "rank": 8, "target_modules": ["q_proj", "v_proj"]}
    doc = _doc(framework="accelerate", precision="bf16-mixed", peft=peft, software={"accelerate": "1.10.0"})
    rep = estimate(doc)
    assert any(a.startswith("not modelled: accelerate 1.10.0's FSDP2") for a in rep.assumptions)
    assert any(a.startswith("band widened to the widest class") for a in rep.assumptions)
    quiet = estimate(_doc(framework="accelerate", precision="bf16-mixed", peft=peft, software={"accelerate": "1.14.0"}))
    assert not any("FSDP2" in a and "frozen base" in a for a in quiet.assumptions)
    # the widened band's high factor is the calibration's widest class, above the PEFT class's own
    assert rep.band["classes"]["device_used"]["factor_high"] > quiet.band["classes"]["device_used"]["factor_high"]


def test_release_boundary_is_the_first_tag_with_the_upcast() -> None:
    assert FSDP_UPCAST_RELEASE == (0, 30, 0)
    r = resolve(_doc(software={"accelerate": "0.30.0"}))
    assert r.scenario.train.precision == "bf16-mixed"


def test_both_engines_see_the_upcast() -> None:
    pytest.importorskip("torch")
    from vramplan.validate.runner import default_engines

    engines = default_engines("all")
    up, off = resolve(_doc(seq_len=128)), resolve(_doc(seq_len=128, trainer_mixed_precision=False))
    for name in ("analytic", "trace"):
        a, b = engines[name](up).per_gpu.breakdown, engines[name](off).per_gpu.breakdown
        # fp32 moments over 4 ranks: P x 8 / 4, against P x 4 / 4 without the upcast
        assert a["optimizer_states"] == P * 8 // 4 and b["optimizer_states"] == P * 4 // 4, name
        assert a["gradients"] == P * 4 // 4 and b["gradients"] == P * 2 // 4, name


def test_the_keys_say_when_they_are_not_read() -> None:
    # set outside a full fine-tune under FSDP with the Trainer or accelerate, each key is named as not used
    ddp = estimate(_doc(parallel={"fsdp": "none"}, trainer_mixed_precision=False, software={"accelerate": "1.10.0"}))
    assert any(a.startswith("train.trainer_mixed_precision set but not used") for a in ddp.assumptions)
    assert any(a.startswith("software.accelerate set but not used") for a in ddp.assumptions)
    # read where they apply: no such line (also after the rewrite to bf16-mixed, the flag set true)
    fsdp = estimate(_doc(trainer_mixed_precision=True, software={"accelerate": "1.10.0"}))
    assert fsdp.scenario["train"]["precision"] == "bf16-mixed"
    assert not any("set but not used" in a and ("accelerate" in a or "trainer_mixed" in a) for a in fsdp.assumptions)
