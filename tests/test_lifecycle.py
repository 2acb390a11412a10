"""The job's lifecycle phases (analytic/lifecycle): hand-computed oracles on a tiny Llama.

The tiny model (as tests/test_cli.py): hidden 256, MLP 688, 2 layers, 4 heads, 2 KV heads, vocabulary
1000, untied head.  Its tensors in module order: embedding 256,000; per layer q 65,536, k 32,768,
v 32,768, o 65,536, two norms 256, gate/up/down 176,128 each (725,504 per layer); final norm 256;
head 256,000: 1,963,264 elements.  Every size below is a multiple of 512 unless said (the allocator's
rounding, which the phase streams apply).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.analytic.lifecycle import job_lifecycle
from vramplan.analytic.lifecycle.evaluation import _forward_bytes, _kept_logits
from vramplan.analytic.lifecycle.load import host_load_bytes
from vramplan.analytic.lifecycle.steps import first_step
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.train import TrainResult, train_step
from vramplan.catalog.resolve import resolve

TINY: dict[str, Any] = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}


def _doc(train: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": TINY, "hardware": {"gpu": "A100-80GB"},
                           "train": {"seq_len": 128, "micro_batch_size": 1, **(train or {})}}
    doc.update(extra)
    return doc


def _step(doc: dict[str, Any]) -> TrainResult:
    return train_step(resolve(doc))


def _phases(doc: dict[str, Any]) -> dict[str, Moment]:
    tr = _step(doc)
    assert tr.context is not None and tr.layout is not None
    job = job_lifecycle(tr.context, tr.layout, tr.terms, tr.moments)
    return {p.name: p.moment for p in job.phases}


def test_load_fp32_then_cast_peaks_at_the_first_cast() -> None:
    # bf16-true holds 2 B/parameter; loaded fp32: 1,963,264 x 4 = 7,853,056 B, then cast one tensor at a
    # time, the embedding first: its bf16 copy 256,000 x 2 = 512,000 beside all the fp32 tensors.
    # Peak 7,853,056 + 512,000 = 8,365,056: the fp32 embedding (1,024,000) is the staging copy, the rest
    # parameters (7,853,056 - 1,024,000 + 512,000 = 7,341,056).  Each cast after it frees more than it makes.
    load = _phases(_doc({"precision": "bf16-true"}, lifecycle={"load_dtype": "fp32"}))["load"]
    assert load.total == 8_365_056
    assert load.get(K.LOAD_STAGING) == 1_024_000 and load.get(K.PARAMETERS) == 7_341_056


def test_load_direct_is_the_parameters() -> None:
    # the default: each tensor in the dtype the step holds it; bf16-true: 1,963,264 x 2 = 3,926,528
    load = _phases(_doc({"precision": "bf16-true"}))["load"]
    assert load.total == 3_926_528 and load.get(K.LOAD_STAGING) == 0


QLORA = {"peft": {"method": "qlora"}, "quantization": "nf4"}


def test_quantize_on_load_and_kbit_preparation() -> None:
    # nf4 linear: numel / 2 payload + numel / 64 x 4 absmax, rounded up to 512:
    #   q, o 65,536 -> 32,768 + 4,096 = 36,864; k, v 32,768 -> 16,384 + 2,048 = 18,432;
    #   gate, up, down 176,128 -> 88,064 + 11,008 = 99,072 -> 99,328 (rounded)
    #   a layer: 2 x 36,864 + 2 x 18,432 + 3 x 99,328 = 408,576, + two bf16 norms 2 x 512 -> 409,600
    # load: embedding 512,000 + 2 x 409,600 + final norm 512 + head 512,000 = 1,843,712, the peak (the
    # largest staging copy, layer 1's down in bf16 352,256, comes with less loaded: 1,683,456).
    ph = _phases(_doc(QLORA))
    assert ph["load"].total == 1_843_712 and ph["load"].get(K.LOAD_STAGING) == 0
    # preparation casts the embedding, the 5 norms and the head to fp32, in parameter order:
    #   after it: 2 x 408,576 + 1,024,000 + 5 x 1,024 + 1,024,000 = 2,870,272
    #   peak at the head's cast, its bf16 original (512,000) beside its fp32 copy: 3,382,272
    prep = ph["peft preparation"]
    assert prep.total == 3_382_272
    assert prep.get(K.PREPARE_CAST) == 1_024_000 and prep.get(K.PARAMETERS) == 2_358_272


LITGPT_QLORA = {"precision": "bf16-true", "peft": {"method": "qlora"}, "quantization": "nf4"}


def test_litgpt_load_quantizes_each_linear_as_built_then_from_the_checkpoint() -> None:
    # Lit-GPT (framework lightning, nf4, bf16-true), in GPT.__init__'s order: its LM head first (an nn.Linear,
    # quantized: 256,000 -> 128,000 + 16,000 = 144,000 -> 144,384 rounded to 512), the bf16 embedding 512,000,
    # two layers of 409,600 (as in test_quantize_on_load_and_kbit_preparation), the final norm 512:
    #   all made: 144,384 + 512,000 + 819,200 + 512 = 1,476,096.
    # Built: each linear's bf16 weight and its fp16 copy (2 x numel x 2 B) beside its 4-bit result.  The
    # last one, layer 1's down (176,128: 2 x 352,256 = 704,512), is made with all but the final norm:
    #   1,476,096 - 512 + 704,512 = 2,180,096, the peak (the head's, first: 2 x 512,000 + 144,384).
    # From the checkpoint: each linear's fp16 copy with its new 4-bit result beside the whole model: the
    #   head's 1,476,096 + 512,000 + 144,384 = 2,132,480, a down's 1,476,096 + 352,256 + 99,328 = 1,927,680.
    load = _phases(_doc(LITGPT_QLORA, framework="lightning"))["load"]
    assert load.total == 2_180_096
    assert load.get(K.LOAD_STAGING) == 704_512 and load.get(K.PARAMETERS) == 1_475_584


def test_litgpt_load_peaks_at_the_heads_checkpoint_copy_for_a_large_vocabulary() -> None:
    # vocabulary 4,000: the head 1,024,000 -> 512,000 + 64,000 = 576,000 (a multiple of 512); the embedding
    # 2,048,000; all made: 576,000 + 2,048,000 + 819,200 + 512 = 3,443,712.
    # Built: the head 2 x 2,048,000 + 576,000 = 4,672,000; layer 1's down 3,443,712 - 512 + 704,512 = 4,147,712.
    # From the checkpoint, the head first: 3,443,712 + its fp16 copy 2,048,000 + new 576,000 = 6,067,712.
    big = {**TINY, "vocab_size": 4000}
    load = _phases({**_doc(LITGPT_QLORA, framework="lightning"), "model": big})["load"]
    assert load.total == 6_067_712
    assert load.get(K.LOAD_STAGING) == 2_048_000 and load.get(K.PARAMETERS) == 4_019_712
    # lifecycle.quantize_at_init false: each linear once as a bf16 copy, the head not quantized (as
    # test_quantize_on_load_and_kbit_preparation, with the 4,000-row head and embedding: 2 x 2,048,000 +
    # 819,200 + 512 = 4,915,712), and no k-bit preparation under lightning
    off = _phases({**_doc(LITGPT_QLORA, framework="lightning", lifecycle={"quantize_at_init": False}),
                   "model": big})
    assert off["load"].total == 4_915_712 and "peft preparation" not in off


def test_litgpt_load_holds_its_own_head_for_a_tied_checkpoint() -> None:
    # a tied checkpoint (Falcon) under transformers has no head tensor; Lit-GPT makes one: the same
    # 2,180,096 as the untied TINY (same shapes)
    tied = {**TINY, "tie_word_embeddings": True}
    load = _phases({**_doc(LITGPT_QLORA, framework="lightning"), "model": tied})["load"]
    assert load.total == 2_180_096


def test_quantized_model_under_zero3_loads_whole_then_partitions() -> None:
    # transformers builds a quantized model outside zero.Init and bitsandbytes quantizes it on the GPU: the
    # whole nf4 model, as test_quantize_on_load_and_kbit_preparation, 1,843,712.  deepspeed.initialize then
    # partitions each parameter in module order, its partition (here 1/2) made before its full data is freed:
    # the first, the embedding, 512,000 / 2 = 256,000 beside the whole model: 2,099,712, the peak; each
    # later one frees more than it makes.
    doc = _doc(QLORA, framework="deepspeed", parallel={"zero_stage": 3})
    doc["hardware"] = {"gpu": "A100-80GB", "num_gpus": 2}
    ph = _phases(doc)
    assert ph["load"].total == 2_099_712 and ph["load"].get(K.LOAD_STAGING) == 0
    assert "peft preparation" not in ph


def test_load_reserved_keeps_the_freed_blocks() -> None:
    tr = _step(_doc({"precision": "bf16-true"}, lifecycle={"load_dtype": "fp32"}))
    assert tr.context is not None and tr.layout is not None
    load = job_lifecycle(tr.context, tr.layout, tr.terms, tr.moments).phases[0]
    # the fp32 blocks (7,853,056 B) stay cached after the cast, beside the first bf16 copy: reserved is at
    # least the peak's 8,365,056; the tensors are under 1 MiB (small pool, 2 MiB segments) or open 20 MiB
    # segments (1-10 MiB requests), so the replay rounds up to whole segments: a multiple of 2 MiB
    assert load.name == "load" and load.reserved_bytes >= 8_365_056 and load.reserved_bytes % (2 << 20) == 0


def test_first_step_has_no_states_before_its_optimizer_step() -> None:
    fwd = Moment("forward").add(K.PARAMETERS, 100).add(K.OPTIMIZER_STATES, 50, optimizer="adamw").add(K.SAVED, 120)
    opt = Moment("optimizer").add(K.PARAMETERS, 100).add(K.OPTIMIZER_STATES, 50, optimizer="adamw") \
        .add(K.GRADIENTS, 40)
    # forward without its states: 100 + 120 = 220; the optimizer moment as it is: 190 -> 220
    assert first_step([fwd, opt], 50).total == 220
    # with larger gradients the optimizer moment (100 + 50 + 100 = 250) is the first step's peak
    opt2 = Moment("optimizer").add(K.PARAMETERS, 100).add(K.OPTIMIZER_STATES, 50, optimizer="adamw") \
        .add(K.GRADIENTS, 100)
    assert first_step([fwd, opt2], 50).total == 250


def test_first_step_never_above_the_steady_step() -> None:
    rep = estimate(_doc({"grad_accum_steps": 4}))
    lc = rep.per_gpu.lifecycle
    assert lc["first step"]["allocated_bytes"] <= lc["training step"]["allocated_bytes"]


def test_evaluation_keeps_logits_until_accumulation() -> None:
    tr = _step(_doc(lifecycle={"evaluation": True, "eval_keeps_logits": True, "eval_batches": 3,
                                "eval_batch_size": 2}))
    assert tr.context is not None and tr.layout is not None
    # a batch's logits: bf16 2 B x vocabulary 1000 x 2 sequences x 128 tokens = 512,000 (one GPU), returned by
    # accelerate's convert_outputs_to_fp32 as fp32 under bf16-mixed (the default precision): 1,024,000;
    # the third add: 2 kept while its forward runs (2,048,000), then kept + new + their concatenation
    # 2 x 3 x 1,024,000 = 6,144,000
    assert _kept_logits(tr.context, tr.layout, 2) == (2_048_000, 6_144_000)
    # bf16-true: no autocast, the bf16 logits themselves
    tr16 = _step(_doc({"precision": "bf16-true"}, lifecycle={"evaluation": True, "eval_keeps_logits": True,
                                                          "eval_batches": 3}))
    assert tr16.context is not None and tr16.layout is not None
    assert _kept_logits(tr16.context, tr16.layout, 2) == (1_024_000, 3_072_000)
    tr1 = _step(_doc(lifecycle={"evaluation": True, "eval_keeps_logits": True, "eval_batches": 3,
                                 "eval_accumulation_steps": 1}))
    assert tr1.context is not None and tr1.layout is not None
    # moved to the CPU after every batch: only the one batch, fp32: 256,000 x 4 = 1,024,000 at batch size 2
    assert _kept_logits(tr1.context, tr1.layout, 2) == (0, 1_024_000)


def test_evaluation_off_by_default_under_the_hf_trainer_on_under_litgpt() -> None:
    assert "evaluation" not in estimate(_doc()).per_gpu.lifecycle
    assert "evaluation" in estimate(_doc({"precision": "bf16-true"}, framework="lightning")).per_gpu.lifecycle


FSDP2 = {"hardware": {"gpu": "A100-80GB", "num_gpus": 2}, "parallel": {"fsdp": "full_shard"}}


@pytest.mark.parametrize(("kind", "gathered", "optim_gathered"), [
    # FSDP keeps fp32 parameters (4 B): whole model 1,963,264 x 4 = 7,853,056; the largest unit is a layer,
    # 725,504 x 4 = 2,902,016 (the root unit: 512,256 x 4 = 2,049,024).
    # full: the optimizer's state dict is gathered after the model's and is larger, so the save's moment is
    # the optimizer's: AdamW fp32 states 8 B x 1,963,264 = 15,706,112 (2 ranks x 7,853,056) plus one layer's
    # states in the all-gather buffer 8 x 725,504 = 5,804,032: 21,510,144 > the model's 10,755,072
    ("full", 0, 15_706_112 + 5_804_032),
    ("full_offload", 2_902_016, 0),
    ("sharded", 0, 0),
])
def test_checkpoint_save_by_state_dict_type(kind: str, gathered: int, optim_gathered: int) -> None:
    save = _phases({**_doc(), **FSDP2, "lifecycle": {"state_dict_type": kind}})["checkpoint save"]
    assert save.get(K.SAVE_GATHERED) == gathered
    assert save.get(K.SAVE_OPTIM_GATHERED) == optim_gathered


def test_full_save_of_adapters_gathers_the_model_not_the_optimizer() -> None:
    # LoRA: the adapters' states are small, so the model's full state dict is the save's moment; the frozen
    # base is bf16 under FSDP with PEFT (2 B): 1,963,264 x 2 = 3,926,528 plus a layer 725,504 x 2 = 1,451,008
    save = _phases({**_doc({"peft": {"rank": 8}}), **FSDP2, "lifecycle": {"state_dict_type": "full"}})
    assert save["checkpoint save"].get(K.SAVE_OPTIM_GATHERED) == 0
    assert save["checkpoint save"].get(K.SAVE_GATHERED) > 0


def test_deepspeed_full_save_gathers_no_optimizer_state() -> None:
    doc = {**_doc(), "hardware": {"gpu": "A100-80GB", "num_gpus": 2}, "framework": "deepspeed",
           "parallel": {"zero_stage": 3}, "lifecycle": {"state_dict_type": "full"}}
    assert _phases(doc)["checkpoint save"].get(K.SAVE_OPTIM_GATHERED) == 0


def test_host_ram_of_loading() -> None:
    # no device map: the model in host RAM in fp32 (bf16-mixed holds fp32): 1,963,264 x 4 = 7,853,056, plus
    # one bf16 checkpoint shard being read, the whole 1,963,264 x 2 = 3,926,528 (under 5 GB): 11,779,584
    tr = _step(_doc())
    assert tr.context is not None and host_load_bytes(tr.context) == 11_779_584
    tr2 = _step(_doc(lifecycle={"device_map": "auto"}))
    assert tr2.context is not None and host_load_bytes(tr2.context) == 3_926_528


def test_report_peak_is_the_maximum_over_the_phases() -> None:
    rep = estimate({**_doc(), **FSDP2, "lifecycle": {"state_dict_type": "full"}})
    pg = rep.per_gpu
    rows = pg.lifecycle
    assert list(rows) == ["load", "first step", "training step", "checkpoint save"]
    assert pg.peak_allocated_bytes == max(r["allocated_bytes"] for r in rows.values())
    assert pg.peak_reserved_bytes >= max(r["reserved_bytes"] for r in rows.values())
    # on this tiny model the full state dict is the allocated peak (the step's replayed segments still
    # reserve more: the device-used peak is the phase with the most)
    assert pg.peak_phase == "checkpoint save"
    assert pg.lifecycle_peak_phase == max(rows, key=lambda k: rows[k]["device_used_bytes"])
    # the optimizer's full state dict: 15,706,112 + 5,804,032 (test_checkpoint_save_by_state_dict_type)
    assert pg.breakdown_detail["optimizer_states"]["gathered for checkpoint save"] == 21_510_144
    assert any(a.startswith("lifecycle, checkpoint save: state dict full") for a in rep.assumptions)


def test_default_report_keeps_the_step_figures() -> None:
    rep = estimate(_doc())
    pg = rep.per_gpu
    step = pg.lifecycle["training step"]
    assert pg.peak_phase in ("forward", "backward", "optimizer")
    assert step["allocated_bytes"] == pg.peak_allocated_bytes and step["reserved_bytes"] == pg.peak_reserved_bytes
    assert step["device_used_bytes"] == pg.device_used_bytes and pg.lifecycle_peak_phase == "training step"
    assert rep.host.load_peak_bytes == 11_779_584


def test_cli_prints_one_line_per_phase_and_marks_the_peak() -> None:
    from typer.testing import CliRunner

    from vramplan.cli.main import app

    res = CliRunner().invoke(app, ["estimate", "--model", "llama-3-8b", "--gpu", "A100-80GB", "--peft", "qlora",
                                   "--quantization", "nf4", "--state-dict-type", "full"])
    assert res.exit_code == 0, res.stdout
    text = " ".join(res.stdout.split())  # independent of the terminal's width
    assert "Job phases (GiB allocated / reserved / device used):" in text
    for phase in ("load:", "peft preparation:", "first step:", "training step:", "checkpoint save:"):
        assert phase in text
    assert text.count("<- peak") == 1 and "host RAM while loading" in text


def test_evaluation_sequences_longer_than_training_scale_kept_logits_and_the_forward() -> None:
    lc = {"evaluation": True, "eval_keeps_logits": True, "eval_batches": 3, "eval_batch_size": 2}
    tr = _step(_doc(lifecycle={**lc, "eval_seq_len": 512}))
    assert tr.context is not None and tr.layout is not None
    # a batch's logits at 512 evaluation tokens, fp32 as accelerate returns them under bf16-mixed: 4 B x vocabulary
    # 1000 x 2 sequences x 512 = 4,096,000 (4 x the 128-token batch's 1,024,000); third add: 2 kept (8,192,000),
    # then 2 x 3 x 4,096,000 = 24,576,000
    assert _kept_logits(tr.context, tr.layout, 2) == (8_192_000, 24_576_000)
    # the no-grad forward of 2 x 512 = 1,024 tokens: the residual stream in and out of a layer, fp32,
    # 2 x 1,024 x 256 x 4 = 2,097,152, plus the larger of the head's tensors (the 128-token micro-batch's
    # logits 256,000 + fp32 copy 512,000 + log-probs 512,000 = 1,280,000, x 2 x 512 / 128 = 10,240,000) and one
    # MLP's (1,024 x 688 x 2 B x 3 = 4,227,072): 12,337,152
    assert _forward_bytes(tr.context, tr.layout, 2) == 12_337_152
    long, short = (estimate(_doc(lifecycle={"evaluation": True, "eval_batch_size": 2, "eval_seq_len": n}))
                   for n in (4096, 64))
    base = estimate(_doc(lifecycle={"evaluation": True, "eval_batch_size": 2}))
    ev = [r.per_gpu.lifecycle["evaluation"]["allocated_bytes"] for r in (short, base, long)]
    assert ev[0] < ev[1] < ev[2]
    # the step itself does not depend on the evaluation's length
    assert long.per_gpu.lifecycle["training step"] == base.per_gpu.lifecycle["training step"]


def test_the_evaluation_assumption_names_its_length() -> None:
    on = estimate(_doc(lifecycle={"evaluation": True, "eval_seq_len": 512}))
    assert any("sequences of 512 tokens" in a for a in on.assumptions)
    assert not any("sequences of" in a for a in estimate(_doc(lifecycle={"evaluation": True})).assumptions)


def _eval_cache(train: dict[str, Any] | None = None, **extra: Any) -> int:
    lc = {"evaluation": True, "eval_batch_size": 2, **extra.pop("lifecycle", {})}
    return _phases(_doc(train, lifecycle=lc, **extra))["evaluation"].get(K.EVAL_CACHE)


V4 = {"transformers": "4.57.3"}


def test_the_evaluation_forward_holds_its_cache() -> None:
    # the tiny Llama's config leaves use_cache to transformers' default (true), which a 4.x HF Trainer keeps: each
    # evaluation forward builds a DynamicCache of every layer's K and V: 2 layers x 2 (K, V) x 2 KV heads x 64 x 2 B
    # (bf16 compute) = 1,024 B per token; 2 sequences x 128 tokens: 262,144 B
    assert _eval_cache(software=V4) == 262_144
    # gradient checkpointing turns it off in training only (self.gradient_checkpointing and self.training)
    assert _eval_cache({"gradient_checkpointing": "full"}, software=V4) == 262_144
    # a script that turns it off; TRL's SFTTrainer passes use_cache=False from 0.22 (facts/trl.py), and 0.15-0.16
    # load a model by name with use_cache=False under gradient checkpointing
    assert _eval_cache({"use_cache": False}, software=V4) == 0
    assert _eval_cache(software={**V4, "trl": "0.22.0"}) == 0
    assert _eval_cache(software={**V4, "trl": "0.21.0"}) == 262_144
    assert _eval_cache({"gradient_checkpointing": "full"}, software={**V4, "trl": "0.16.1"}) == 0
    assert _eval_cache({"gradient_checkpointing": "full"}, software={**V4, "trl": "0.17.0"}) == 262_144
    # the HF Trainer from transformers 5.0 writes TrainingArguments.use_cache (default False) to the config: none on
    # the current release unless the arguments ask for it; a loop of one's own keeps the config's
    assert _eval_cache() == _eval_cache(software={"transformers": "5.0.0"}) == 0
    assert _eval_cache({"use_cache": True}) == 262_144
    assert _eval_cache(framework="plain") == 262_144
    # Lit-GPT's own model builds no cache in a forward
    assert _eval_cache({"precision": "bf16-true"}, framework="lightning") == 0


def test_the_evaluation_cache_of_a_prepared_kbit_base_is_fp32() -> None:
    # QLoRA under the HF Trainer: peft's k-bit preparation leaves the norms fp32, so under bf16 autocast each
    # bitsandbytes linear returns its fp32 input's dtype (Linear4bit.forward: out.to(inp_dtype)) and the keys and
    # values go into the cache before any cast: 2 layers x 2 (K, V) x 2 KV heads x 64 x 4 B = 2,048 B per token,
    # x 2 x 128 tokens = 524,288 B, twice the bf16 figure
    qlora = {"peft": {"method": "qlora", "rank": 8}, "quantization": "nf4"}
    assert _eval_cache(qlora, software=V4) == 524_288
    # LLaMA-Factory runs no k-bit preparation and axolotl casts the norms and embeddings back: half hidden states
    assert _eval_cache(qlora, software=V4, framework="llamafactory") == 262_144
    assert _eval_cache(qlora, software=V4, framework="axolotl") == 262_144
    # LoRA on a half base: the compute dtype
    assert _eval_cache({"peft": {"method": "lora", "rank": 8}}, software=V4) == 262_144
    said = estimate(_doc(qlora, lifecycle={"evaluation": True}, software=V4)).assumptions
    assert any("KV cache held to its end in fp32" in a for a in said)


def test_the_evaluation_cache_is_gone_before_the_logits_are_concatenated() -> None:
    # the phase is the larger of the forward (with its cache) and the concatenation (without it): a cache-heavy
    # evaluation is the forward's moment, and its bytes are the difference made by use_cache
    on = _phases(_doc({"use_cache": True}, lifecycle={"evaluation": True, "eval_batch_size": 2}))["evaluation"]
    off = _phases(_doc({"use_cache": False}, lifecycle={"evaluation": True, "eval_batch_size": 2}))["evaluation"]
    assert on.total - off.total == 262_144


def test_use_cache_is_read_by_an_evaluation_under_checkpointing() -> None:
    unread = "train.use_cache set but not used"
    gc = {"gradient_checkpointing": "full", "use_cache": False}
    assert any(a.startswith(unread) for a in estimate(_doc(gc)).assumptions)
    assert not any(a.startswith(unread) for a in estimate(_doc(gc, lifecycle={"evaluation": True})).assumptions)


def test_the_evaluation_cache_is_what_a_real_no_grad_forward_holds() -> None:
    # an independent check on the CPU: the tiny Llama built by transformers, in bf16 and eval mode, one no-grad
    # forward of the evaluation batch with the config's use_cache; the cache's tensors are what the phase counts
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(**{k: v for k, v in TINY.items() if k != "model_type"})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        out = model(input_ids=torch.randint(0, 1000, (2, 128)))
    cache = out.past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == _eval_cache({"precision": "bf16-true"}, software=V4) == 262_144


def test_the_installed_hf_trainer_turns_use_cache_off(tmp_path: Any) -> None:
    # the rule the default follows for transformers >= 5.0, checked on the installed release: the Trainer writes
    # TrainingArguments.use_cache (False) into the model's config, so its evaluation forwards build no cache
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("the 4.x Trainer leaves the config's use_cache")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{k: v for k, v in TINY.items() if k != "model_type"})).to(torch.bfloat16)
    assert model.config.use_cache is True
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    transformers.Trainer(model=model, args=args)
    assert model.config.use_cache is False
    assert _eval_cache() == 0


def test_accelerate_returns_fp32_logits_under_autocast() -> None:
    # the rule the kept evaluation logits follow, checked on the installed accelerate: a model prepared under bf16
    # mixed precision returns its bf16 logits as an fp32 copy (convert_outputs_to_fp32), in evaluation too
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **{k: v for k, v in TINY.items() if k != "model_type"})).to(torch.bfloat16)
    from accelerate.state import AcceleratorState, GradientState

    # the process-wide state a Trainer made in another test would refuse a second precision: start afresh, end afresh
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    try:
        model = accelerate.Accelerator(cpu=True, mixed_precision="bf16").prepare(model).eval()
        with torch.no_grad():
            logits = model(input_ids=torch.randint(0, 1000, (2, 16))).logits
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
    assert logits.dtype == torch.float32
    # what the evaluation keeps per batch then: 4 B x 1,000 x 2 x 128 (test_evaluation_keeps_logits_until_accumulation)
    tr = _step(_doc(lifecycle={"evaluation": True, "eval_keeps_logits": True, "eval_accumulation_steps": 1}))
    assert tr.context is not None and tr.layout is not None
    assert _kept_logits(tr.context, tr.layout, 2)[1] == logits.element_size() * 1000 * 2 * 128


def test_an_evaluation_without_cache_says_why() -> None:
    # a default that turns use_cache off is named, with the setting that says otherwise (no silent answer)
    def said(**extra: Any) -> list[str]:
        doc = _doc(lifecycle={"evaluation": True}, **extra)
        return [a for a in estimate(doc).assumptions if a.startswith("lifecycle, evaluation:")]
    assert any("the HF Trainer from transformers 5.0 writes TrainingArguments.use_cache" in a for a in said())
    assert any("TRL's SFTTrainer from 0.22" in a for a in said(software={"trl": "0.22.0"}))
    assert any("TRL 0.15-0.16 load a model named by id" in a
               for a in said(train={"seq_len": 128, "micro_batch_size": 1, "gradient_checkpointing": "full"},
                             software={**V4, "trl": "0.16.1"}))
    # on a 4.x Trainer the config's cache is built and said so
    assert any("each forward's KV cache held to its end" in a for a in said(software=V4))


def test_model_without_zero_init_loads_whole_then_partitions() -> None:
    # lifecycle.zero_init false: deepspeed.initialize casts the host model to bf16 and moves it to the GPU whole,
    # 1,963,264 x 2 = 3,926,528 B, then partitions it in module order (1/2 here), each partition made before its
    # whole tensor is freed: the embedding's first, 256,000 x 2 / 2 = 256,000 beside the whole model: 4,182,528, the
    # peak; each later one frees more than it makes
    doc = _doc({"precision": "bf16-mixed"}, framework="hf-trainer", parallel={"zero_stage": 3},
               lifecycle={"zero_init": False})
    doc["hardware"] = {"gpu": "A100-80GB", "num_gpus": 2}
    assert _phases(doc)["load"].total == 4_182_528
    # built under zero.Init (the default): one module's parameters whole at a time, never the whole model
    doc["lifecycle"] = {}
    assert _phases(doc)["load"].total < 3_926_528


def test_zero_init_is_read_only_under_deepspeed_zero3() -> None:
    # FSDP shards a model unit by unit whatever zero.Init would do: the setting is said to be unused
    doc = _doc({"precision": "bf16-mixed"}, framework="hf-trainer", parallel={"fsdp": "full_shard"},
               lifecycle={"zero_init": False})
    doc["hardware"] = {"gpu": "A100-80GB", "num_gpus": 2}
    text = " ".join(estimate(doc).assumptions)
    assert "lifecycle.zero_init set but not used" in text
    doc["parallel"] = {"zero_stage": 3}
    assert "lifecycle.zero_init set but not used" not in " ".join(estimate(doc).assumptions)


def test_a_tail_after_the_step_reuses_its_cached_blocks_or_opens_segments() -> None:
    from vramplan.analytic.allocator import reserved_after_parts

    mib = 1 << 20
    # a step that allocates and frees a 20 MiB activation leaves its 20 MiB segment cached (rules.py: a request
    # above 10 MiB gets a segment of its own size, 2 MiB-rounded): a 10 MiB evaluation tensor takes it, split
    # (20 MiB reserved); a 40 MiB one finds no block that large and opens a second segment (20 + 40 = 60 MiB)
    step = [[20 * mib, -1]]
    assert reserved_after_parts(step, [10 * mib]) == 20 * mib
    assert reserved_after_parts(step, [40 * mib]) == 60 * mib
    # the tail's ids count from 0 in the tail: its own frees let a later tensor reuse its block
    assert reserved_after_parts(step, [40 * mib, -1, 40 * mib]) == 60 * mib
    # with empty_cache the segment would go: the capacity's retry (release_cached_blocks) frees it when needed
    assert reserved_after_parts(step, [40 * mib], capacity_bytes=50 * mib) == 40 * mib


def test_the_evaluation_forward_stream_peaks_at_the_forward_moment() -> None:
    from vramplan.alloc import replay_compact
    from vramplan.analytic.lifecycle.evaluation import eval_cache_bytes, eval_forward_stream

    # the tiny Llama evaluated in batches of 8 x 128 tokens with its cache: the stream's highest live bytes (as
    # requested, before rounding) are the forward's (two residual tensors and the larger of the MLP's and the head's,
    # _forward_bytes) plus every layer's keys and values (eval_cache_bytes)
    tr = _step(_doc({"use_cache": True}, lifecycle={"evaluation": True, "eval_batch_size": 8},
                    software={"transformers": "4.57.3"}))
    assert tr.context is not None and tr.layout is not None
    tail = eval_forward_stream(tr.context, tr.layout)
    cache = eval_cache_bytes(tr.context, tr.layout, 8)
    # 2 layers x 2 (K, V) x 2 KV heads x 64 x 2 B (bf16 compute) x 1,024 tokens = 1,048,576
    assert cache == 1_048_576
    assert replay_compact(list(tail)).peak_requested_bytes == _forward_bytes(tr.context, tr.layout, 8) + cache


def test_an_evaluation_larger_than_the_micro_batch_adds_segments_to_the_steps() -> None:
    # evaluation batches of 8 after micro-batches of 1: the forward's tensors are 8x the step's, so none fits a block
    # the step cached and the evaluation's reserved bytes are the step's cached segments plus its own
    doc = _doc({"use_cache": True}, lifecycle={"evaluation": True, "eval_batch_size": 8},
               software={"transformers": "4.57.3"})
    rep = estimate(doc)
    packed = estimate(doc, reserved="packed")
    ev, step = rep.per_gpu.lifecycle["evaluation"], rep.per_gpu.lifecycle["training step"]
    assert ev["reserved_bytes"] > packed.per_gpu.lifecycle["evaluation"]["reserved_bytes"]
    assert ev["reserved_bytes"] > step["reserved_bytes"]
    # an evaluation of one sequence fits in what the step cached: no segment beyond the step's
    one = estimate(_doc({"use_cache": True}, lifecycle={"evaluation": True, "eval_batch_size": 1},
                        software={"transformers": "4.57.3"}))
    assert one.per_gpu.lifecycle["evaluation"]["reserved_bytes"] <= one.per_gpu.lifecycle["training step"]["reserved_bytes"]
