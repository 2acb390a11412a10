"""`measure` on the CPU: real steps of tiny models, checked against hand-computed bytes.

Tiny GPT-2: 2 layers, hidden 64, 4 heads, vocabulary 1000, 128 positions, no dropout.
Parameters (hand count): wte 1000*64 = 64,000 (tied with the LM head), wpe 128*64 = 8,192,
per layer ln_1 128 + c_attn 64*192+192 = 12,480 + c_proj 64*64+64 = 4,160 + ln_2 128
+ c_fc 64*256+256 = 16,640 + mlp c_proj 256*64+64 = 16,448 = 49,984; x2 = 99,968; ln_f 128.
Total 172,288 -> fp32 weights 689,152 B, AdamW states 2 * 689,152 = 1,378,304 B.

Tiny Llama: 2 layers, hidden 64, intermediate 172, 4 heads (head_dim 16), 2 KV heads,
vocabulary 1000, untied.  Per layer: q 64*64 + k 64*32 + v 64*32 + o 64*64 = 12,288,
MLP 3*64*172 = 33,024, norms 128 -> 45,440; x2 = 90,880; embeddings + head 2*64,000 = 128,000;
final norm 64.  Total 218,944 -> fp32 weights 875,776 B.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from vramplan.errors import ScenarioError
from vramplan.measure.result import CPU_MEASURED, MeasureResult, relative_error
from vramplan.measure.run import cpu_bound_problem, measure

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 128,
             "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "_name_or_path": "tiny-gpt2"}
TINY_LLAMA = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 172,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
              "max_position_embeddings": 256, "tie_word_embeddings": False, "_name_or_path": "tiny-llama"}
GPT2_PARAMS = 172_288
LLAMA_PARAMS = 218_944


def train_doc(model: dict[str, Any], **train: Any) -> dict[str, Any]:
    # use_cache off: GPT-2's cache copies k and v beside the c_attn buffer its q view keeps (not modelled)
    base = {"micro_batch_size": 2, "seq_len": 32, "precision": "fp32", "optimizer": "adamw", "use_cache": False}
    return {"model": model, "hardware": {"gpu": "T4"}, "train": {**base, **train}}


@pytest.fixture(scope="module")
def gpt2_fp32() -> MeasureResult:
    return measure(train_doc(TINY_GPT2), device="cpu")


@pytest.fixture(scope="module")
def gpt2_bf16() -> MeasureResult:
    return measure(train_doc(TINY_GPT2, precision="bf16-mixed"), device="cpu")


def test_says_what_was_measured(gpt2_fp32: MeasureResult) -> None:
    assert gpt2_fp32.measured == CPU_MEASURED == "cpu live tensor bytes (tracker)"
    assert gpt2_fp32.device == "cpu"
    assert gpt2_fp32.peak_reserved_bytes is None and gpt2_fp32.device_used_bytes is None


def test_weights_and_optimizer_states_exact(gpt2_fp32: MeasureResult) -> None:
    r = gpt2_fp32
    assert r.parameters == r.trainable_parameters == GPT2_PARAMS
    assert r.breakdown["weights"] == GPT2_PARAMS * 4 == 689_152
    assert r.breakdown["optimizer_states"] == 2 * GPT2_PARAMS * 4 == 1_378_304
    # the prediction agrees on both exactly
    assert r.predicted_comparable["weights"] == 689_152
    assert r.predicted_comparable["optimizer_states"] == 1_378_304


def test_breakdown_sums_to_the_peak_and_the_peak_is_the_highest_phase(gpt2_fp32: MeasureResult) -> None:
    r = gpt2_fp32
    assert sum(r.breakdown.values()) == r.peak_allocated_bytes
    for part, sub in r.breakdown_detail.items():
        assert sum(sub.values()) == r.breakdown[part]
    assert max(r.phases.values()) == r.peak_allocated_bytes
    assert r.phases[r.peak_phase] == r.peak_allocated_bytes
    # predicted phases without the CUDA-only cuBLAS workspaces: the predicted peak phase is the peak
    assert r.predicted_phases[r.prediction.per_gpu.peak_phase] == r.predicted_peak_bytes


def test_peak_equals_an_independent_tracker_run() -> None:
    """The same step, written out by hand under a bare Tracker, peaks at the same bytes."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from vramplan.trace.tracker import Tracker

    cfg = dict(TINY_GPT2)
    cfg.pop("_name_or_path")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg),
                                             attn_implementation="sdpa", dtype=torch.float32)
    model.train()
    groups = [{"params": [p for n, p in model.named_parameters() if not ("bias" in n or "ln" in n)],
               "weight_decay": 0.0},
              {"params": [p for n, p in model.named_parameters() if "bias" in n or "ln" in n], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-5, foreach=True)
    ids = torch.randint(0, 1000, (1, 16))

    def step() -> None:
        loss = model(input_ids=ids, labels=ids).loss / 1  # measure divides by the accumulation steps
        loss.backward()
        del loss
        opt.step()

    step()
    opt.zero_grad(set_to_none=True)
    with Tracker() as tr:
        tr.track(list(model.parameters()), "weights")
        tr.track([v for s in opt.state.values() for k, v in s.items() if k != "step"], "optimizer_states")
        tr.track([ids], "inputs")
        step()
        hand_peak = tr.peak_bytes
    res = measure(train_doc(TINY_GPT2, micro_batch_size=1, seq_len=16), device="cpu")
    assert res.peak_allocated_bytes == hand_peak


def test_fp32_gpt2_matches_the_prediction(gpt2_fp32: MeasureResult) -> None:
    r = gpt2_fp32
    rows = {row.part: row for row in r.rows}
    # backward at the loss: 12 bytes per token per vocabulary entry = 12 * 64 * 1000 = 768,000 B
    # (+4 B: the loss's own gradient scalar)
    assert r.breakdown["temporaries"] == 768_004
    assert r.predicted_comparable["temporaries"] == 768_000
    assert r.peak_phase == r.prediction.per_gpu.peak_phase == "backward"
    err = rows["peak allocated"].relative_error
    assert err is not None and abs(err) < 0.01
    # cuBLAS workspaces do not exist on the CPU: they are left out of the comparison
    assert r.excluded_predicted == {"other.cuBLAS workspaces": r.prediction.per_gpu.breakdown_detail["other"][
        "cuBLAS workspaces"]}


def test_bf16_mixed_autocast_weight_copies_exact(gpt2_bf16: MeasureResult) -> None:
    # autocast caches a bf16 copy of every linear weight: per layer 64*192 + 64*64 + 64*256 + 256*64
    # = 49,152; x2 layers = 98,304; + the tied LM head 64,000 = 162,304 elements x 2 B = 324,608 B
    detail = gpt2_bf16.breakdown_detail["temporaries"]
    assert detail["autocast weight copies"] == 324_608
    assert gpt2_bf16.prediction.per_gpu.breakdown_detail["temporaries"]["autocast weight copies"] == 324_608
    assert any("CPU autocast" in n for n in gpt2_bf16.notes)


def test_llama_optimizer_step_peak_exact() -> None:
    """With a large share of parameters, the peak is the foreach AdamW step (sqrt temporary)."""
    r = measure(train_doc(TINY_LLAMA), device="cpu")
    assert r.parameters == LLAMA_PARAMS
    assert r.breakdown["weights"] == r.breakdown["gradients"] == LLAMA_PARAMS * 4 == 875_776
    # foreach AdamW: torch._foreach_sqrt(exp_avg_sqs) of the decay group (every matrix: all but the
    # 5 norm weights, 218,944 - 5*64 = 218,624 elements) x 4 B = 874,496 B
    assert r.peak_phase == "optimizer"
    assert r.breakdown_detail["temporaries"] == {"optimizer step": 874_496}
    assert r.breakdown["optimizer_states"] == 2 * 875_776
    assert r.predicted_peak_bytes == sum(r.predicted_comparable.values())
    assert r.rows[-1].part == "peak allocated" and r.rows[-1].relative_error is not None
    assert abs(r.rows[-1].relative_error) < 0.001


def test_without_warmup_the_states_are_created_in_the_measured_step() -> None:
    r = measure(train_doc(TINY_LLAMA), device="cpu", warmup=False)
    # the states appear inside optimizer.step() (alive at the end, so they are optimizer states).
    # The peak is the decay group's foreach sqrt, before the no-decay group (5 norm weights) has
    # states: 2 x (218,944 - 5 x 64) x 4 B = 1,748,992 B, plus on the CPU the group's 16 four-byte
    # step counters (7 matrices x 2 layers + embeddings + head) = 64 B
    assert r.peak_phase == "optimizer"
    assert r.breakdown["optimizer_states"] == 2 * (LLAMA_PARAMS - 5 * 64) * 4 + 16 * 4 == 1_749_056


def test_lora_gradients_and_states_only_for_adapters() -> None:
    r = measure(train_doc(TINY_LLAMA, peft={"rank": 4, "target_modules": ["q_proj", "v_proj"]},
                          grad_accum_steps=2), device="cpu")
    # adapters per layer: q (64+64)*4 + v (64+32)*4 = 896; x2 = 1,792 trainable parameters
    assert r.trainable_parameters == 1_792
    assert r.breakdown["gradients"] == 1_792 * 4
    assert r.breakdown["optimizer_states"] == 2 * 1_792 * 4
    assert r.breakdown["weights"] == (LLAMA_PARAMS + 1_792) * 4


def test_inference_kv_cache_exact() -> None:
    doc = {"model": TINY_LLAMA, "task": "inference", "hardware": {"gpu": "T4"},
           "inference": {"batch_size": 2, "prompt_len": 16, "new_tokens": 4, "dtype": "fp32"}}
    r = measure(doc, device="cpu")
    assert r.breakdown["weights"] == LLAMA_PARAMS * 4
    assert set(r.phases) == {"prefill", "decode"}
    # at the prefill peak: K and V of 2 layers x 2 sequences x 2 KV heads x 16 dims x 16 tokens x 4 B
    assert r.peak_phase == "prefill"
    assert r.breakdown["kv_cache"] == 2 * 2 * 2 * 2 * 16 * 16 * 4 == 16_384


def test_beam_search_runs_every_tensor_over_batch_times_beams() -> None:
    def doc(beams: int) -> dict[str, Any]:
        return {"model": TINY_LLAMA, "task": "inference", "hardware": {"gpu": "T4"},
                "inference": {"batch_size": 2, "prompt_len": 16, "new_tokens": 4, "dtype": "fp32", "num_beams": beams}}
    one, three = measure(doc(1), device="cpu"), measure(doc(3), device="cpu")
    # transformers' generate repeats the 2 prompts 3 times before the prefill: 6 rows, so the prompt's cache at the
    # prefill peak is 3 x the 16,384 B of test_inference_kv_cache_exact
    assert one.peak_phase == three.peak_phase == "prefill"
    assert three.breakdown["kv_cache"] == 3 * one.breakdown["kv_cache"] == 49_152
    # beam search's buffers before the prefill (analytic/inference.py beam_state_bytes): 6 rows, L = 16 + 4 = 20,
    # G = 4: 16 x 6 x 20 + 8 x 6 x 4 = 2,112 B, within what the run holds beside them (the repeated input ids and
    # mask, 2 x 6 x 16 x 8 = 1,536 B, and the beams' scores)
    assert three.predicted_comparable["temporaries"] == 2_112 < three.breakdown["temporaries"] < 2_112 + 2_600


def test_shrink_options_reach_the_prediction() -> None:
    doc = train_doc(TINY_LLAMA)
    r = measure(doc, device="cpu", layers=1, seq_len=8, micro_batch_size=1)
    assert r.scenario["train"]["seq_len"] == 8 and r.scenario["train"]["micro_batch_size"] == 1
    # one layer fewer: 218,944 - 45,440 = 173,504 parameters, measured and predicted
    assert r.parameters == 173_504 and r.prediction.model["parameters"] == 173_504


def test_unsupported_scenarios_are_refused_with_every_reason() -> None:
    doc = train_doc(TINY_LLAMA, optimizer="adamw-8bit", precision="fp8-mixed")
    # an H100: on a T4 the scenario validator refuses fp8-mixed before measure looks (spec/checks.py)
    doc["hardware"] = {"gpu": "H100", "num_gpus": 2}
    with pytest.raises(ScenarioError) as info:
        measure(doc, device="cpu")
    text = str(info.value)
    assert "needs bitsandbytes on CUDA" in text and "one process" in text and "Transformer Engine" in text


def test_cpu_refusal_names_bytes_and_option() -> None:
    with pytest.raises(ScenarioError) as info:
        measure(train_doc(TINY_LLAMA), device="cpu", max_cpu_bytes=1_000)
    (problem,) = info.value.problems
    assert problem.where == "--max-cpu-bytes" and "1,000 bytes" in problem.message
    assert "--layers" in problem.hint and "--max-cpu-bytes" in problem.hint


def test_cpu_bound_rule() -> None:
    gib = 2**30
    assert cpu_bound_problem(7 * gib, None, 16 * gib) is None  # under half of 16 GiB
    p = cpu_bound_problem(9 * gib, None, 16 * gib)
    assert p is not None and "50% of the 16.00 GiB" in p.message and f"{9 * gib:,} bytes" in p.message
    assert cpu_bound_problem(9 * gib, 10 * gib, 16 * gib) is None  # an explicit bound wins
    assert cpu_bound_problem(9 * gib, None, None) is None  # unknown host memory: no refusal


def test_relative_error_sign() -> None:
    assert relative_error(1_050_000, 1_000_000) == pytest.approx(0.05)
    assert relative_error(900, 1_000) == pytest.approx(-0.1)
    assert relative_error(5, 0) is None and relative_error(None, 3) is None


TINY_BERT = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 256,
             "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 128, "type_vocab_size": 2,
             "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


def test_bert_masked_lm_fp32() -> None:
    # BertForMaskedLM: embeddings 1000*64 + 128*64 + 2*64 + LayerNorm 128 = 72,448; per layer
    # q,k,v,o 4*(64*64+64) = 16,640 + LN 128 + 64*256+256 = 16,640 + 256*64+64 = 16,448 + LN 128
    # = 49,984, x2 = 99,968; MLM head dense 4,160 + LN 128 + decoder bias 1,000 (weight tied) = 5,288
    r = measure(train_doc(TINY_BERT), device="cpu")
    assert r.parameters == 72_448 + 99_968 + 5_288 == 177_704
    assert r.breakdown["weights"] == 177_704 * 4 and r.prediction.model["parameters"] == 177_704


def test_fp16_mixed_runs_with_a_grad_scaler() -> None:
    r = measure(train_doc(TINY_LLAMA, precision="fp16-mixed"), device="cpu")
    assert r.breakdown["weights"] == LLAMA_PARAMS * 4  # fp32 parameters under autocast
    assert r.breakdown["optimizer_states"] == 2 * LLAMA_PARAMS * 4


def test_bf16_true_adafactor_upcasts_in_step() -> None:
    r = measure(train_doc(TINY_LLAMA, precision="bf16-true", optimizer="adafactor"), device="cpu")
    assert r.breakdown["weights"] == LLAMA_PARAMS * 2 and r.phases["optimizer"] == r.peak_allocated_bytes
    # transformers' Adafactor on a bf16 parameter holds fp32 copies of the parameter and its gradient,
    # the update and the factored estimate: 4 fp32 tensors of the largest parameter (the 1000 x 64
    # embedding or LM head), 4 * 4 * 64,000 = 1,024,000 B at least
    assert r.breakdown_detail["temporaries"]["optimizer step"] >= 1_024_000
    assert "autocast weight copies" not in r.breakdown_detail["temporaries"]  # not mistaken for autocast


def test_selective_checkpointing_with_sdpa_equals_none() -> None:
    none = measure(train_doc(TINY_LLAMA, micro_batch_size=1, seq_len=16), device="cpu")
    sel = measure(train_doc(TINY_LLAMA, micro_batch_size=1, seq_len=16, gradient_checkpointing="selective"),
                  device="cpu")
    assert sel.peak_allocated_bytes == none.peak_allocated_bytes
    assert any("selective recomputation" in n for n in sel.notes)
    with pytest.raises(ScenarioError, match="use attention: sdpa"):
        measure(train_doc(TINY_LLAMA, gradient_checkpointing="selective", attention="eager"), device="cpu")


def test_full_checkpointing_keeps_less_than_none() -> None:
    kw: dict[str, Any] = {"micro_batch_size": 1, "seq_len": 64, "optimizer": "sgd"}
    none = measure(train_doc(TINY_LLAMA, **kw), device="cpu")
    full = measure(train_doc(TINY_LLAMA, gradient_checkpointing="full", **kw), device="cpu")
    assert full.phases["forward"] < none.phases["forward"]


@pytest.mark.parametrize(("train_keys", "where", "words"), [
    # the estimate would count Liger's fused head, CCE's log-sum-exp or torchtune's chunks while the step ran
    # transformers' own loss: each is refused rather than measured as something else
    ({"loss": "liger-fused-linear-ce"}, "train.loss", "liger-kernel package on a GPU (this run is on the CPU)"),
    ({"liger_kernels": True}, "train.liger_kernels", "liger-kernel package on a GPU"),
    ({"loss": "cut-cross-entropy"}, "train.loss", "cut-cross-entropy needs its own training loop"),
    ({"loss": "chunked", "framework": "plain"}, "train.loss", "chunked needs its own training loop"),
    ({"packing": True, "attention": "flash"}, "train.packing", "padded rows"),
    ({"activation_offload": "cpu", "gradient_checkpointing": "full"}, "train.activation_offload",
     "activation offloading"),
])
def test_inputs_measure_does_not_run_are_refused(train_keys: dict[str, object], where: str, words: str) -> None:
    doc = train_doc(TINY_LLAMA)
    train_keys = dict(train_keys)  # the parameter is shared by reruns
    framework = train_keys.pop("framework", None)
    if framework is not None:
        doc["framework"] = framework  # torchtune's chunked loss is refused under hf-trainer by the validator
    doc["train"].update(train_keys)
    with pytest.raises(ScenarioError) as info:
        measure(doc, device="cpu")
    assert any(p.where == where and words in p.message for p in info.value.problems), info.value.problems


TINY_FALCON_MAMBA = {"model_type": "falcon_mamba", "vocab_size": 1024, "hidden_size": 64, "num_hidden_layers": 2,
                     "state_size": 8, "expand": 2, "conv_kernel": 4, "time_step_rank": 8, "use_bias": False,
                     "use_conv_bias": True, "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False,
                     "pad_token_id": 0}


def test_attention_free_model_generates() -> None:
    # a Mamba model has no attention layer: measure builds it with eager attention (transformers refuses sdpa for
    # MambaForCausalLM and its like) and lets generate make its own cache where forward takes no past_key_values
    # (transformers 5.17's Mamba classes; the H100 run of benchmarks/gpu/h100-2026-11-27e failed both ways before)
    doc = {"model": TINY_FALCON_MAMBA, "task": "inference", "hardware": {"gpu": "H100"},
           "inference": {"dtype": "fp32", "batch_size": 1, "prompt_len": 16, "new_tokens": 4}}
    r = measure(doc, device="cpu")
    err = {row.part: row.relative_error for row in r.rows}["peak allocated"]
    assert err is not None and abs(err) < 0.05


def test_torchtune_recipes_are_not_measured_as_transformers_steps() -> None:
    # framework torchtune means torchtune's own model and recipe (adapters in the model's dtype, torchao NF4),
    # which measure's transformers step is not
    doc = train_doc(TINY_LLAMA)
    doc["framework"] = "torchtune"
    with pytest.raises(ScenarioError) as info:
        measure(doc, device="cpu")
    assert any(p.where == "framework" and "not torchtune" in p.message for p in info.value.problems)
