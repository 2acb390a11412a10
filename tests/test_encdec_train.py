"""Encoder-decoder training (analytic/terms/encoder_decoder.py): the encoder's and the cross-attention's terms by
hand, the analytic engine against the traced one (transformers' own T5ForConditionalGeneration and
BartForConditionalGeneration run on the meta device, trace/step.py), the source length key and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vramplan.analytic.attention import resolve_attention
from vramplan.analytic.terms.context import StepContext, step_policy
from vramplan.analytic.terms.encoder_decoder import cross_tensors, encoder_tensors, t5_mlp_extra
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError

# google-t5/t5-small (T5 v1.0: relu, tied head, dropout_rate 0.1 by T5Config's default)
T5_SMALL: dict[str, Any] = {"model_type": "t5", "d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
                            "d_kv": 64, "vocab_size": 32128, "feed_forward_proj": "relu"}
# google/flan-t5-base (T5 v1.1: gated-gelu)
FLAN_T5_BASE: dict[str, Any] = {"model_type": "t5", "d_model": 768, "d_ff": 2048, "num_layers": 12,
                                "num_decoder_layers": 12, "num_heads": 12, "d_kv": 64, "vocab_size": 32128,
                                "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
# google/umt5-small's shape (a bias table in every self-attention)
UMT5_SMALL: dict[str, Any] = {"model_type": "umt5", "d_model": 512, "d_ff": 1024, "num_layers": 8,
                              "num_decoder_layers": 8, "num_heads": 6, "d_kv": 64, "vocab_size": 256384,
                              "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}
# facebook/bart-base
BART_BASE: dict[str, Any] = {"model_type": "bart", "d_model": 768, "vocab_size": 50265, "encoder_layers": 6,
                             "decoder_layers": 6, "encoder_attention_heads": 12, "decoder_attention_heads": 12,
                             "encoder_ffn_dim": 3072, "decoder_ffn_dim": 3072}


def _doc(model: dict[str, Any], **train: Any) -> dict[str, Any]:
    return {"model": model, "hardware": {"gpu": "H100-80GB"}, "task": "train",
            "train": {"precision": "bf16-mixed", **train}}


def _context(model: dict[str, Any], **train: Any) -> StepContext:
    r = resolve(_doc(model, **train))
    attention, repeat = resolve_attention(r.scenario, r.model, step_policy(r.scenario), r.gpu)
    return StepContext(r, 0, attention, repeat)


def test_t5_small_encoder_by_hand() -> None:
    c = _context(T5_SMALL, micro_batch_size=2, seq_len=32, source_len=64)
    # T5's bias is SDPA's mask: the memory-efficient kernel
    assert c.act.attention == "efficient"
    # bf16-mixed: r = 4 (fp32 residual), c = 2, h = 512, I = 2048, 8 heads of 64, dropout 0.1; 2 x 64 = 128 tokens.
    # Per token and layer (activations.layer_tensors): input norm 4 h + 4 h + 4 = 4,100; q/k/v's autocast copies of
    # the fp32 normalised input 3 x 2 h = 3,072; q, k, v, output 4 x 2 x 512 = 4,096; logsumexp 4 x 8 = 32;
    # residual dropout mask 512; MLP norm 4,100; wi's input copy 1,024; ReLU's output 2 I = 4,096; dropout mask
    # 512 -> 21,544; T5's feed-forward: the dropout mask before wo I = 2,048 and wo's input copy 2 I = 4,096
    assert t5_mlp_extra(c.m, c.act, 2048) == 2048 + 4096
    # -> 27,688 per token; x 128 tokens x 6 layers = 21,264,384
    # + the embedding dropout's mask 512 x 128 = 65,536; the bucket indices 8 x 64^2 = 32,768; one bias mask copy
    # per layer 6 x 8 x 64 x 64 x 2 = 393,216; the final norm 4,100 x 128 = 524,800 and its dropout mask 65,536
    assert sum(encoder_tensors(c)) == 65_536 + 21_264_384 + 32_768 + 393_216 + 524_800 + 65_536


def test_t5_small_cross_attention_by_hand() -> None:
    c = _context(T5_SMALL, micro_batch_size=2, seq_len=32, source_len=64)
    got = {t.name: t.nbytes for t in cross_tensors(c)}
    # per target token (2 x 32 = 64): the cross-attention's norm 4,100; q's autocast input copy 2 x 512 = 1,024;
    # q and the kernel's output 2 x 2 x 512 = 2,048; logsumexp 4 x 8 = 32; the residual dropout mask 512
    # -> 7,716 x 64 = 493,824
    assert got["cross_attention.per_target"] == 7716 * 64
    # per source token (2 x 64 = 128): k and v 2 x 2 x 512, and their autocast copies of the fp32 encoder output
    # 2 x 2 x 512 -> 4,096 x 128 = 524,288
    assert got["cross_attention.per_source"] == 4096 * 128
    # the causal bias mask: the compute-dtype mask 8 heads x 32 x 32 x 2 = 16,384 and where's bool condition
    # 32 x 32 = 1,024
    assert got["self_attention.bias_mask"] == 16_384 + 1_024
    # the decoder's feed-forward extras (6,144 per token) over 64 target tokens
    assert got["mlp.t5_extra"] == 6144 * 64


def test_bart_has_no_bias_terms() -> None:
    c = _context(BART_BASE, micro_batch_size=2, seq_len=32, source_len=64)
    assert {t.name for t in cross_tensors(c)} == {"cross_attention.per_target", "cross_attention.per_source"}
    assert c.act.attention == "flash"  # BART's SDPA takes no mask: flash on an H100


def test_source_len_defaults_to_seq_len() -> None:
    same = estimate(_doc(T5_SMALL, micro_batch_size=2, seq_len=128))
    given = estimate(_doc(T5_SMALL, micro_batch_size=2, seq_len=128, source_len=128))
    assert same.per_gpu.peak_allocated_bytes == given.per_gpu.peak_allocated_bytes
    longer = estimate(_doc(T5_SMALL, micro_batch_size=2, seq_len=128, source_len=512))
    assert longer.per_gpu.peak_allocated_bytes > same.per_gpu.peak_allocated_bytes
    assert any("encoder-decoder training" in a for a in longer.assumptions)


# the traced engine runs transformers' own modules: within 3% of it in peak allocated bytes
AGREEMENT = [
    (T5_SMALL, {"micro_batch_size": 4, "seq_len": 128, "source_len": 512}),
    (T5_SMALL, {"micro_batch_size": 4, "seq_len": 100, "source_len": 300}),  # rows not a multiple of 8 keys
    (T5_SMALL, {"micro_batch_size": 4, "seq_len": 128, "source_len": 512, "precision": "bf16-true"}),
    (T5_SMALL, {"micro_batch_size": 4, "seq_len": 128, "source_len": 512, "gradient_checkpointing": "full"}),
    (FLAN_T5_BASE, {"micro_batch_size": 2, "seq_len": 256, "source_len": 1024}),
    (FLAN_T5_BASE, {"micro_batch_size": 4, "seq_len": 128, "source_len": 512,
                    "peft": {"method": "lora", "rank": 16, "target_modules": ["q", "v"]}}),
    (UMT5_SMALL, {"micro_batch_size": 4, "seq_len": 128, "source_len": 512}),
    (BART_BASE, {"micro_batch_size": 4, "seq_len": 128, "source_len": 512}),
    (BART_BASE, {"micro_batch_size": 8, "seq_len": 256, "source_len": 1024}),
    (BART_BASE, {"micro_batch_size": 8, "seq_len": 16, "source_len": 1024}),  # a long source, a short target
    (BART_BASE, {"micro_batch_size": 4, "seq_len": 128, "source_len": 512,
                 "peft": {"method": "lora", "rank": 16}}),
]


@pytest.mark.parametrize(("model", "train"), AGREEMENT,
                         ids=lambda x: x["model_type"] if "model_type" in x else "-".join(map(str, x.values())))
def test_analytic_agrees_with_the_trace(model: dict[str, Any], train: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = _doc(model, **train)
    a = estimate(doc).per_gpu.peak_allocated_bytes
    t = traced(doc).per_gpu.peak_allocated_bytes
    assert abs(a - t) / t < 0.03, (a, t)


def test_ddp_agrees_with_the_trace() -> None:
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = _doc(T5_SMALL, micro_batch_size=4, seq_len=128, source_len=512)
    doc["hardware"]["num_gpus"] = 2
    a = estimate(doc).per_gpu.peak_allocated_bytes
    t = traced(doc).per_gpu.peak_allocated_bytes
    assert abs(a - t) / t < 0.03, (a, t)


# DeepSpeed ZeRO-2 on 8 GPUs: the gradients partitioned as they are reduced (contiguous_gradients off: DeepSpeed then
# allocates no reduce bucket, stage_1_and_2.py setup_buckets, which the trace does not model), the optimizer states and
# fp32 masters partitioned; the trace shards its single-GPU tensors (trace/parallel.py)
ZERO2 = [
    ("openai/whisper-tiny", {"seq_len": 128}),
    ("openai/whisper-base", {"seq_len": 448}),
    (T5_SMALL, {"seq_len": 128, "source_len": 512}),
    (BART_BASE, {"seq_len": 128, "source_len": 512}),
]


@pytest.mark.parametrize(("model", "train"), ZERO2, ids=["whisper-tiny", "whisper-base", "t5-small", "bart-base"])
def test_zero2_agrees_with_the_trace(model: Any, train: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    doc = {"model": model, "hardware": {"gpu": "A100-80GB", "num_gpus": 8}, "task": "train", "framework": "deepspeed",
           "parallel": {"zero_stage": 2, "deepspeed": {"contiguous_gradients": False}},
           "train": {"precision": "bf16-mixed", "micro_batch_size": 4, **train}}
    a = estimate(doc).per_gpu.peak_allocated_bytes
    t = traced(doc).per_gpu.peak_allocated_bytes
    assert abs(a - t) / t < 0.01, (a, t)
    # ZeRO-2 shards the optimizer states: below DDP's on the same GPUs
    doc.pop("framework")
    doc["parallel"] = {"zero_stage": 0}
    assert a < estimate(doc).per_gpu.peak_allocated_bytes


@pytest.mark.parametrize(("train", "parallel", "key"), [
    ({"attention": "flash"}, {}, "train.attention"),
    ({"source_len": 2000}, {}, "train.source_len"),
    ({"liger_kernels": True}, {}, "train.loss"),
    ({"gradient_checkpointing": "attention-core"}, {}, "train.gradient_checkpointing"),
    ({}, {"tp": 2}, "parallel"),
    ({}, {"fsdp": "full_shard"}, "parallel.fsdp"),
    ({}, {"zero_stage": 1}, "parallel.zero_stage"),
    ({}, {"zero_stage": 3}, "parallel.zero_stage"),
])
def test_what_is_not_modelled_is_refused(train: dict[str, Any], parallel: dict[str, Any], key: str) -> None:
    doc = _doc(BART_BASE if "source_len" in train else T5_SMALL, **train)
    if parallel:
        doc["parallel"] = parallel
        doc["hardware"]["num_gpus"] = 2
    with pytest.raises(ScenarioError) as err:
        resolve(doc)
    assert any(p.where == key for p in err.value.problems), err.value
    assert "is an encoder-decoder model" in str(err.value)


def test_source_len_is_noted_for_a_decoder_only_model() -> None:
    doc = {"model": {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100},
           "hardware": {"gpu": "H100-80GB"}, "task": "train", "train": {"seq_len": 64, "source_len": 32}}
    assert any("train.source_len is not read" in a for a in estimate(doc).assumptions)
    doc["train"].pop("source_len")
    assert not any("source_len" in a for a in estimate(doc).assumptions)


@pytest.mark.parametrize("model", [T5_SMALL, BART_BASE], ids=["t5-small", "bart-base"])
@pytest.mark.parametrize("ckpt", ["none", "full"])
def test_the_event_stream_holds_the_encoder(model: dict[str, Any], ckpt: str) -> None:
    from vramplan.alloc import replay
    from vramplan.analytic.events import train_run_events
    from vramplan.analytic.train import train_step

    tr = train_step(resolve(_doc(model, micro_batch_size=4, seq_len=128, source_len=512,
                                 gradient_checkpointing=ckpt)))
    assert tr.layout is not None and tr.layout.vision_saved
    res = replay(train_run_events(tr.layout))
    # the stream's tensors are the terms' records (encoder_sequence among them): its allocated peak is the closed
    # form's, within the stream's ordering of a layer's records (2.4% for bart-base without checkpointing)
    assert abs(res.peak_allocated_bytes / tr.peak.total - 1) < 0.03


# transformers 4.x: T5Attention is eager (no SDPA path up to 4.57.1), the default sdpa falls back to it
def test_t5_small_eager_4x_by_hand() -> None:
    c = _context(T5_SMALL, micro_batch_size=2, seq_len=32, source_len=64)
    c4 = resolve(_doc(T5_SMALL, micro_batch_size=2, seq_len=32, source_len=64) | {"software": {"transformers": "4.46.3"}})
    attention, repeat = resolve_attention(c4.scenario, c4.model, step_policy(c4.scenario), c4.gpu)
    assert (attention, repeat) == ("eager", False)
    e = StepContext(c4, 0, attention, repeat)
    # encoder, per token and layer: the SDPA layer's 27,688 (test_t5_small_encoder_by_hand) less q, k, v, output
    # 4,096 and logsumexp 32, plus eager's q, k, v 3 x 2 x 512 = 3,072, the fp32 softmax 4 x 8 heads x 64 keys = 2,048,
    # the attention dropout's mask 8 x 64 = 512 and output 2 x 8 x 64 = 1,024, o's input 2 x 512 = 1,024
    # -> 27,688 - 4,128 + 7,680 = 31,240; x 128 tokens x 6 layers = 23,992,320; no bias mask (the bias is added to
    # the scores in place and kept by nothing); the embedding dropout 65,536, the bucket indices 32,768, the final
    # norm 524,800 and its dropout 65,536
    assert sum(encoder_tensors(e)) == 65_536 + 23_992_320 + 32_768 + 524_800 + 65_536
    assert sum(encoder_tensors(c)) - sum(encoder_tensors(e)) == 6 * 128 * (4_128 - 7_680) + 393_216
    got = {t.name: t.nbytes for t in cross_tensors(e)}
    # per target token (64): the norm 4,100, q's autocast input copy 1,024, q 1,024, the fp32 softmax over the 64
    # source keys 4 x 8 x 64 = 2,048, the dropout's mask 512 and output 1,024, o's input 1,024, the residual dropout
    # mask 512 -> 11,268
    assert got["cross_attention.per_target"] == 11_268 * 64
    assert got["cross_attention.per_source"] == 4096 * 128
    # no kernel masks: the causal bias plus mask and the cross-attention's zero bias plus mask live through the
    # decoder's forward only
    assert set(got) == {"cross_attention.per_target", "cross_attention.per_source", "mlp.t5_extra"}


def test_eager_4x_refusals() -> None:
    four = {"software": {"transformers": "4.46.3"}}
    for train, key in (({"attention": "flash"}, "train.attention"),
                       ({"gradient_checkpointing": "full"}, "train.gradient_checkpointing")):
        with pytest.raises(ScenarioError) as err:
            resolve(_doc(T5_SMALL, **train) | four)
        assert any(p.where == key for p in err.value.problems), err.value
    # transformers 5's eager T5 (eager_attention_forward: softmax in the compute dtype) and BART on 4.x: refused
    with pytest.raises(ScenarioError) as err:
        resolve(_doc(T5_SMALL, attention="eager"))
    assert any(p.where == "train.attention" for p in err.value.problems)
    with pytest.raises(ScenarioError) as err:
        resolve(_doc(BART_BASE) | four)
    assert any(p.where == "software.transformers" for p in err.value.problems)
    resolve(_doc(T5_SMALL, attention="eager") | four)  # accepted
    # releases before the earliest read (4.30.2) are refused; 4.30 itself is the first accepted
    with pytest.raises(ScenarioError) as err:
        resolve(_doc(T5_SMALL) | {"software": {"transformers": "4.29.2"}})
    assert any(p.where == "software.transformers" and "4.30 to 4.57" in p.message for p in err.value.problems)
    resolve(_doc(T5_SMALL) | {"software": {"transformers": "4.30.0"}})
    # a config saying tie_word_embeddings: false: 4.x holds lm_head apart (5.24 ties it), estimated
    resolve(_doc(UMT5_SMALL) | four)
    resolve(_doc(UMT5_TIED) | four)
    resolve(_doc(UMT5_SMALL))


def test_untied_head_4x_by_hand() -> None:
    """transformers 4.x keeps a T5 config's tie_word_embeddings: false (a separate lm_head; modeling_t5.py 4.46.3
    l.1915-1918), 5.24 ties the head (T5Config.__post_init__)."""
    from vramplan.analytic.train import train_step

    four = {"software": {"transformers": "4.46.3"}}
    shape = {"micro_batch_size": 2, "seq_len": 256, "source_len": 1024}
    untied = resolve(_doc(FLAN_T5_BASE, **shape) | four)
    tied = resolve(_doc(FLAN_T5_TIED, **shape) | four)
    assert not untied.model.tie_word_embeddings and tied.model.tie_word_embeddings
    # the head: 32,128 x 768 = 24,674,304 parameters more
    head = 32_128 * 768
    assert untied.model.num_parameters - tied.model.num_parameters == head == 24_674_304
    assert any("transformers 4.x's T5Config keeps" in n for n in untied.model.notes)
    assert not any("forces tie_word_embeddings" in n for n in untied.model.notes)
    # 5.24 (no software.transformers) ties it whatever the config says: the same model as the tied config's
    assert resolve(_doc(FLAN_T5_BASE, **shape)).model.num_parameters == tied.model.num_parameters

    def terms(r: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in train_step(r).terms:
            out[t.name] = out.get(t.name, 0) + t.nbytes
        return out

    a, b = terms(untied), terms(tied)
    # bf16-mixed AdamW: the fp32 weight 4 x 24,674,304 = 98,697,216, its two fp32 states 8 x 24,674,304 =
    # 197,394,432, and optimizer.step()'s temporaries, 4 B per parameter (optimizer_cost_of): 98,697,216
    assert a["parameters"] - b["parameters"] == 98_697_216
    assert a["optimizer.states"] - b["optimizer.states"] == 197_394_432
    assert a["optimizer.step"] - b["optimizer.step"] == 98_697_216
    # the gradients: lm_head's (the head's backward) and shared's own (the embeddings' backward, beside the bias
    # tables' 2 x 32 buckets x 12 heads x 4 = 3,072) in place of the tied weight's head gradient and the embedding's
    # second one: 4 x 24,674,304 each, the same total
    assert a["gradients.embedding"] == 98_697_216 + 3_072 and a.get("gradients.tied_embedding", 0) == 0
    assert b["gradients.tied_embedding"] == 98_697_216
    assert sum(v for k, v in a.items() if k.startswith("gradients")) == sum(
        v for k, v in b.items() if k.startswith("gradients"))
    # nothing else moves: the head's saved input is the decoder output either way (the tied model's rescale,
    # ``sequence_output * (self.model_dim**-0.5)``, saves nothing: a multiply by a Python number), and the autocast
    # copy of the head's weight is lm_head's in place of shared's
    same = {k for k in a if not k.startswith(("gradients", "optimizer", "parameters"))}
    assert {k: a[k] for k in same} == {k: b.get(k, 0) for k in same}


UMT5_TIED = {k: v for k, v in UMT5_SMALL.items() if k != "tie_word_embeddings"}
FLAN_T5_TIED = {k: v for k, v in FLAN_T5_BASE.items() if k != "tie_word_embeddings"}


# an unpacked transformers 4.x install with its own dependencies (pip install --no-deps --target DIR
# transformers==4.46.3 huggingface_hub==0.26.5 tokenizers==0.20.3 requests urllib3 idna certifi charset-normalizer),
# put first on sys.path of a subprocess (tests/trace_t5_4x.py); skipped where it is not there (4.57.1 gives t5-small's
# "mixed" case the same 0.2%)
TF4 = os.environ.get("VRAMPLAN_TF4_PATH", "/tmp/tfw/ov-4.46.3")
EAGER_4X = [
    (T5_SMALL, {}),
    (T5_SMALL, {"precision": "bf16-true"}),
    (T5_SMALL, {"seq_len": 100, "source_len": 300}),
    (T5_SMALL, {"peft": {"method": "lora", "rank": 16, "target_modules": ["q", "v"]}}),
    (T5_SMALL, {"precision": "fp32"}),
    (UMT5_TIED, {}),  # a bias table in every self-attention, each layer's bias plus mask made and freed in the layer
    (FLAN_T5_TIED, {"micro_batch_size": 2, "seq_len": 256, "source_len": 1024}),  # gated-gelu
    # tie_word_embeddings: false, a separate lm_head on 4.x (the tied estimate was 3.4% and 22% below these traces)
    (FLAN_T5_BASE, {"micro_batch_size": 2, "seq_len": 256, "source_len": 1024}),
    (UMT5_SMALL, {}),
    # sdpa, the default: 4.x's T5 has no SDPA path, the analytic and the traced engine fall back to eager (the trace
    # asked 4.x's from_config for "sdpa" and got its ValueError before trace/build.py looked up the seq2seq class)
    (T5_SMALL, {"attention": "sdpa"}),
]


@pytest.mark.parametrize(("model", "train"), EAGER_4X,
                         ids=["mixed", "bf16-true", "odd", "lora", "fp32", "umt5-tied", "flan-t5-base-tied",
                              "flan-t5-base", "umt5-small", "sdpa"])
def test_eager_4x_agrees_with_the_trace(model: dict[str, Any], train: dict[str, Any]) -> None:
    if not Path(TF4, "transformers", "models", "t5", "modeling_t5.py").exists():
        pytest.skip(f"no transformers 4.x at {TF4}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TF4, str(Path(__file__).parents[1] / "src")]),
           "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(Path(__file__).with_name("trace_t5_4x.py")), json.dumps(model),
                          json.dumps(train)], capture_output=True, text=True, env=env, timeout=600, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["transformers"].startswith("4.")
    # the release's own model has the spec's parameters (an untied config: lm_head held apart)
    assert got["parameters"] == got["spec_parameters"]
    a, t = got["analytic"], got["traced"]
    assert abs(a - t) / t < 0.03, (a, t)


def test_the_trace_reads_sdpa_support_from_the_seq2seq_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """trace/build.py asks the class the model is built with (T5ForConditionalGeneration), not the causal-LM mapping
    (which holds no T5 and said True), whether it runs SDPA: transformers 4.x's T5 says False (PreTrainedModel's
    default, modeling_utils.py 4.46.3 l.1392), and the trace falls back to eager as transformers' default does."""
    transformers = pytest.importorskip("transformers")
    from vramplan.trace.build import _auto_class, _supports_sdpa

    r = resolve(_doc(T5_SMALL))
    auto = _auto_class(r)
    assert auto is transformers.AutoModelForSeq2SeqLM
    config = transformers.T5Config(**{k: v for k, v in T5_SMALL.items() if k != "model_type"})
    cls = transformers.T5ForConditionalGeneration
    monkeypatch.setattr(cls, "_supports_sdpa", False)  # 4.x's T5 (5.24's runs SDPA)
    assert not _supports_sdpa(config, auto)
    monkeypatch.setattr(cls, "_supports_sdpa", True)
    assert _supports_sdpa(config, auto)
    assert _auto_class(resolve(_doc(BART_BASE, seq_len=128))) is transformers.AutoModelForSeq2SeqLM
    assert _auto_class(resolve({"model": "openai/whisper-tiny", "hardware": {"gpu": "H100-80GB"}, "task": "train",
                                 "train": {"seq_len": 128}})) \
        is transformers.AutoModelForSpeechSeq2Seq


def test_the_loss_assumption_names_the_release_modelled() -> None:
    def loss_note(doc: dict[str, Any]) -> str:
        return next(a for a in estimate(doc).assumptions if a.startswith("loss as an encoder-decoder model"))

    shape = {"micro_batch_size": 2, "seq_len": 32, "source_len": 64}
    assert "(T5ForConditionalGeneration / BartForConditionalGeneration, transformers 5.24)" in loss_note(
        _doc(T5_SMALL, **shape))
    old = loss_note(_doc(T5_SMALL, **shape) | {"software": {"transformers": "4.46.3"}})
    assert "transformers 4.46.3)" in old and "5.24" not in old
    assert "transformers 5.24)" in loss_note(_doc(T5_SMALL, **shape) | {"software": {"transformers": "5.2.0"}})


def test_mt5_without_the_key_is_untied_on_4x() -> None:
    # MT5Config.__init__ defaults tie_word_embeddings to False in 4.x (configuration_mt5.py 4.46.3 and 4.57.1 l.100),
    # so an mT5 config that names no tie is built with a separate lm_head there; T5Config and UMT5Config default to
    # True.  umt5-small's shape as mT5: the head is 256,384 x 512 = 131,268,608 parameters
    four = {"software": {"transformers": "4.46.3"}}
    mt5 = {k: v for k, v in UMT5_TIED.items()} | {"model_type": "mt5"}
    untied = resolve(_doc(mt5) | four).model
    tied = resolve(_doc(mt5 | {"tie_word_embeddings": True}) | four).model
    assert not untied.tie_word_embeddings and tied.tie_word_embeddings
    assert untied.num_parameters - tied.num_parameters == mt5["vocab_size"] * 512 == 131_268_608
    # a T5 config without the key stays tied on 4.x, and 5.x ties every one
    assert resolve(_doc({k: v for k, v in T5_SMALL.items() if k != "tie_word_embeddings"}) | four).model \
        .tie_word_embeddings
    assert resolve(_doc(mt5)).model.tie_word_embeddings
