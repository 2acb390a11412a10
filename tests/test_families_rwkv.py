"""RWKV-4 (``rwkv``, transformers ``modeling_rwkv.py``): attention-free time-mixing (wkv) and channel-mixing blocks.
Tensors counted by hand and on transformers' meta device, the recurrent state by hand and against transformers' own
``state`` after a prefill, generate by the analytic engine against the traced engine's, the traced training step
(full and LoRA), and what is not modelled refused."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from meta_build import bf16_prefill, category_bytes, meta_causal_lm_count
from vramplan import estimate
from vramplan.analytic.ssm_state import (
    mixer_decode_bytes,
    mixer_prefill_bytes,
    ssm_state_bytes,
    ssm_state_note,
)
from vramplan.errors import VramplanError
from vramplan.spec.hf_config import model_from_config

# A test input, not a released checkpoint: intermediate_size null -> 4 x 32 = 128, untied head (RwkvConfig's default)
TESTER: dict[str, Any] = {"model_type": "rwkv", "vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 3,
                          "context_length": 256}


def _shape(size: str) -> dict[str, Any]:
    """The RWKV-4 Pile checkpoints' shapes as transformers' conversion script builds their config
    (convert_rwkv_checkpoint_to_hf.py: NUM_HIDDEN_LAYERS_MAPPING, HIDEN_SIZE_MAPPING, vocab_size 50277 of the
    tokenizer; the other keys RwkvConfig's defaults).  Test inputs, not catalog rows (no verbatim config.json read)."""
    layers = {"169M": 12, "430M": 24, "1B5": 24, "3B": 32, "7B": 32, "14B": 40}[size]
    hidden = {"169M": 768, "430M": 1024, "1B5": 2048, "3B": 2560, "7B": 4096, "14B": 5120}[size]
    return {"model_type": "rwkv", "vocab_size": 50277, "hidden_size": hidden, "num_hidden_layers": layers,
            "context_length": 1024}


def _meta_count(cfg: dict[str, Any]) -> int:
    return meta_causal_lm_count(cfg)


def test_tester_count_by_hand() -> None:
    # embeddings 99 x 32 = 3,168 and head 3,168 (untied); pre_ln (block 0) 64; ln_out 64
    # per block: ln1, ln2 4 x 32 = 128; time_decay, time_first 64; attention's time_mix 3 x 32 = 96; key, value,
    #   receptance, output 4 x 32 x 32 = 4,096; feed_forward's time_mix 64; key 32 x 128 = 4,096; receptance 1,024;
    #   value 4,096 -> 13,664, x 3 = 40,992
    # 6,336 + 64 + 64 + 40,992 = 47,456
    m = model_from_config(TESTER)
    assert m.num_parameters == 47_456
    assert m.mamba is not None and m.mamba.kind == "rwkv4" and m.mamba.layers == (0, 1, 2)
    assert m.intermediate_size == 128 and not m.tie_word_embeddings and m.traits.state_argument


@pytest.mark.parametrize("changes", [
    {}, {"tie_word_embeddings": True}, {"intermediate_size": 48}, {"num_hidden_layers": 1},
])
def test_tester_matches_transformers_meta_module(changes: dict[str, Any]) -> None:
    shape = {**TESTER, **changes}
    assert model_from_config(shape).num_parameters == _meta_count(shape)


def test_169m_shape_by_hand() -> None:
    # embeddings and head 2 x 50,277 x 768 = 77,225,472; pre_ln and ln_out 2 x 1,536 = 3,072
    # per block: norms 3,072; time_decay/time_first 1,536; time_mix 2,304 + 1,536; attention's four 768 x 768 linears
    #   2,359,296; feed_forward key and value 2 x 768 x 3,072 = 4,718,592, receptance 589,824 -> 7,676,160, x 12 =
    #   92,113,920
    # 77,225,472 + 3,072 + 92,113,920 = 169,342,464
    assert model_from_config(_shape("169M")).num_parameters == 169_342_464


@pytest.mark.parametrize("size", ["169M", "430M", "1B5", "3B", "7B", "14B"])
def test_pile_shapes_match_transformers_meta_module(size: str) -> None:
    shape = _shape(size)
    assert model_from_config(shape).num_parameters == _meta_count(shape)


def test_state_and_terms_by_hand() -> None:
    m = model_from_config(_shape("169M"))
    # bf16: 768 x (2 x 2 + 3 x 4) = 12,288 B per layer, x 12 = 147,456 per sequence; 4 sequences 589,824
    assert ssm_state_bytes(m, 4, 2) == 589_824
    note = ssm_state_note(m, 2)
    assert note is not None and "147,456 B per sequence of RWKV-4" in note
    # the prefill's block, 1 sequence of 1,000 tokens, bf16: the feed-forward's squared ReLU step,
    # (7 x 768 + 2 x 3,072) x 1,000 x 2 = 23,040,000 (above (9 x 768 + 3,072) x 2,000 = 19,968,000 and 8 x 768 x 2,000)
    assert mixer_prefill_bytes(m, 1, 1000, 2) == 23_040_000
    # a decode step: the wkv step, 768 x (6 x 2 + 10 x 4) + 768 x 2 (-exp(time_decay)) = 41,472, above the
    # feed-forward's 2 x (8 x 768 + 3,072) = 18,432
    assert mixer_decode_bytes(m, 1, 2) == 41_472
    # fp32: current_key.float() is no copy (9 fp32 step tensors): 768 x (24 + 36) + 768 x 4 = 49,152; the feed-forward
    # 4 x 9,216 = 36,864
    assert mixer_decode_bytes(m, 1, 4) == 49_152
    # 4 sequences: transformers' step broadcasts to 4 positions of 4 sequences, a prefill block at 4 tokens,
    # (7 x 768 + 2 x 3,072) x 4 x 4 x 2 = 368,640, above the one-position step 4 x 768 x 52 + 1,536 = 161,280
    assert mixer_decode_bytes(m, 4, 2) == 368_640


def test_a_multi_sequence_decode_step_broadcasts_in_transformers() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**TESTER)).eval()
        with torch.no_grad():
            state = module(torch.randint(0, 99, (3, 5)), use_cache=True).state
            logits = module(torch.randint(0, 99, (3, 1)), state=state, use_cache=True).logits
    # the 2-D shift state times the (1, 1, h) mix broadcasts against the (3, 1, h) token: 3 positions per sequence
    assert tuple(logits.shape) == (3, 3, 99)


def test_state_equals_transformers_state_after_a_prefill() -> None:
    torch = pytest.importorskip("torch")
    state = bf16_prefill(TESTER, 2, 10)[1].state
    assert [t.dtype for t in state] == [torch.bfloat16] * 2 + [torch.float32] * 3
    held = sum(t.numel() * t.element_size() for t in state)
    # 2 sequences x 3 layers x 32 x (2 x 2 + 3 x 4) = 3,072
    assert held == ssm_state_bytes(model_from_config(TESTER), 2, 2) == 3_072


def test_traced_training_step_holds_the_adapters_parameters() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.engine import trace

    shape = {**TESTER, "num_hidden_layers": 2}
    doc = {"model": shape, "hardware": {"gpu": "A100-80GB"}, "train": {"micro_batch_size": 1, "seq_len": 16}}
    r, st = trace(resolve(doc))
    weights = category_bytes(st.events, "weights")
    grads = category_bytes(st.events, "gradients")
    states = category_bytes(st.events, "optimizer_states")
    # bf16-mixed: fp32 parameters (47,456 - 13,664 = 33,792 for two blocks; x 4 = 135,168 B), fp32 gradients, AdamW's
    # two moments
    assert weights == grads == 4 * r.model.num_parameters == 135_168
    assert states == 2 * weights
    assert [ph for _, ph in st.marks] == ["forward", "backward", "optimizer", "end"]


def test_traced_lora_adapts_the_default_targets() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.engine import trace

    shape = {**TESTER, "num_hidden_layers": 2}
    doc = {"model": shape, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 1, "seq_len": 16, "peft": {"method": "lora", "rank": 4}}}
    _, st = trace(resolve(doc))
    adapted = {e.op.split(".")[-4] + "." + e.op.split(".")[-5] for e in st.events
               if e.category == "gradients" and e.nbytes > 0 and "lora_A" in e.op}
    # facts/peft_targets.py "rwkv": key, value, receptance, output match both the attention's and the feed-forward's
    assert adapted == {"key.attention", "value.attention", "receptance.attention", "output.attention",
                       "key.feed_forward", "value.feed_forward", "receptance.feed_forward"}
    grads = category_bytes(st.events, "gradients")
    # rank 4, fp32 A and B: per block the attention's four linears 4 x 4 x (32 + 32) = 1,024 elements; the
    # feed-forward's key 4 x (32 + 128) = 640, receptance 4 x 64 = 256, value 640 -> 2,560 a block, x 2 = 5,120
    # elements, 20,480 B
    assert grads == 20_480


@pytest.mark.parametrize(("prompt", "batch"), [(100, 2), (200, 2), (50, 4), (4, 16)])
def test_traced_generate_agrees_with_the_analytic_engine(prompt: int, batch: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.catalog.resolve import resolve
    from vramplan.trace.report import peak_of
    from vramplan.trace.step import trace_inference

    doc = {"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": batch, "prompt_len": prompt, "new_tokens": 10}}
    a = estimate(doc)
    st = trace_inference(resolve(doc))
    traced = peak_of(st.events, st.marks).phases
    # the trace rounds every block to 512 B (the 37 vectors of 32 bf16 weights: 37 x 448 = 16,576 B more); within
    # 0.3% below at the prefill; the decode step of 16 sequences (a block of 16 broadcast positions) 0.4% above
    for phase in ("prefill", "decode"):
        assert 0.997 < a.per_gpu.phases[phase] / traced[phase] < 1.005
    if prompt > batch:
        # the prefill peaks, its running block 2 sequences x 100 tokens x 2 B x (7 x 32 + 2 x 128) = 192,000 B at 100
        assert a.per_gpu.breakdown_detail["activations"]["running layer"] == batch * prompt * 2 * (7 * 32 + 2 * 128)
    assert any("RWKV-4 blocks without a KV cache" in x for x in a.assumptions)


def test_the_analytic_engine_refuses_training() -> None:
    doc = {"task": "train", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
           "train": {"micro_batch_size": 1, "seq_len": 64}}
    with pytest.raises(VramplanError) as exc:
        estimate(doc)
    assert "--engine trace" in str(exc.value) and "wkv loop" in str(exc.value)


@pytest.mark.parametrize(("doc", "path", "why"), [
    ({"task": "serve"}, "task", "vLLM has no RWKV model class"),
    ({"task": "inference", "parallel": {"tp": 2}, "hardware": {"gpu": "A100-80GB", "num_gpus": 2}}, "parallel.tp",
     "no base_model_tp_plan"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "int8"}}, "inference.kv_cache_dtype", "QuantizedCache"),
    ({"task": "inference", "software": {"transformers": "4.57.0"}}, "software.transformers", "5.24"),
])
def test_what_is_not_modelled_is_refused(doc: dict[str, Any], path: str, why: str) -> None:
    with pytest.raises(VramplanError) as exc:
        estimate({"hardware": {"gpu": "A100-80GB"}, **doc, "model": TESTER})
    text = str(exc.value)
    assert path in text and "is an RWKV-4 model (3 time-mixing and channel-mixing blocks" in text and why in text


def test_attention_hidden_size_other_than_hidden_is_refused() -> None:
    with pytest.raises((VramplanError, ValueError)) as exc:
        estimate({"task": "inference", "model": {**TESTER, "attention_hidden_size": 16},
                  "hardware": {"gpu": "A100-80GB"}})
    assert "attention_hidden_size 16 other than hidden_size 32" in str(exc.value)
