"""The hybrid attention + Mamba2 family (Bamba, transformers ``modeling_bamba.py``): tensors counted by hand, the
KV cache of the attention layers only, the mixers' state per sequence, and what is refused."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from vramplan import estimate
from vramplan.analytic.kv_cache import kv_bytes_per_token, kv_cache_bytes
from vramplan.analytic.ssm_state import mixer_prefill_bytes, ssm_state_bytes, ssm_state_layer_bytes
from vramplan.catalog.models import load_model
from vramplan.errors import ScenarioError
from vramplan.spec.hf_config import model_from_config

# transformers' own Bamba test configuration (tests/data/bamba-tester/SOURCE.md): a test input, not a catalog model
TESTER = str(Path(__file__).resolve().parent / "data" / "bamba-tester" / "config.json")

# The shape of Bamba-9B as its model card gives it (32 layers, hidden 4096, 32 heads, 8 KV heads, untied,
# 9.78B parameters) on BambaConfig's defaults, with the attention layers and state size that public
# descriptions of ibm-ai-platform/Bamba-9B quote (attn_layer_indices [9, 18, 27], mamba_d_state 128).  A test
# input, not a catalog row: its config.json could not be read verbatim.
BAMBA_9B_SHAPE = {"model_type": "bamba", "vocab_size": 128000, "hidden_size": 4096, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "attn_layer_indices": [9, 18, 27], "mamba_d_state": 128}


def test_tester_count_by_hand() -> None:
    # transformers' BambaModelTester config: h 32, 4 layers (attention at 1 and 3), 4 heads / 2 KV heads of 8,
    # I 64, V 99 untied; mixers: inter 2*32 = 64, 16 heads of 64/16 = 4, 1 group, state 16, d_conv 4:
    # conv_dim = 64 + 2*16 = 96
    # embed 99*32 = 3,168; lm_head 3,168; final norm 32
    # every layer: MLP 3*32*64 = 6,144; two norms 64 -> 6,208, x 4 = 24,832
    # mixer: conv1d 96*4 + 96 = 480; in_proj 32*(64 + 96 + 16) = 5,632; dt_bias, A_log, D 3*16 = 48;
    #        norm 64; out_proj 64*32 = 2,048 -> 8,272, x 2 = 16,544
    # attention: q 32*32 + k 32*16 + v 32*16 + o 32*32 = 3,072, x 2 = 6,144
    # 3,168 + 3,168 + 32 + 24,832 + 16,544 + 6,144 = 53,888
    m = load_model(TESTER)
    assert m.num_parameters == 53_888
    assert m.mamba is not None and m.mamba.layers == (0, 2)
    assert (m.mamba.n_heads, m.mamba.head_dim, m.mamba.conv_dim) == (16, 4, 96)


def test_bamba_9b_shape_matches_transformers_meta_module() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = model_from_config(BAMBA_9B_SHAPE)
    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**BAMBA_9B_SHAPE)
        with torch.device("meta"):
            module = transformers.AutoModelForCausalLM.from_config(cfg)
    assert spec.num_parameters == sum(p.numel() for p in module.parameters()) == 9_778_138_240


def test_ssm_state_bytes_by_hand() -> None:
    m = model_from_config(BAMBA_9B_SHAPE)
    # conv_dim = 8192 + 2*1*128 = 8,448; conv state 8,448 * 4 taps * 2 B (bf16) = 67,584 B
    # SSM state 128 heads * 64 * 128 * 4 B (fp32) = 4,194,304 B
    assert ssm_state_layer_bytes(m, 2) == (67_584, 4_194_304)
    # 29 mixer layers * (67,584 + 4,194,304) = 29 * 4,261,888 = 123,594,752 B per sequence; 4 sequences x 4
    assert ssm_state_bytes(m, 1, 2) == 123_594_752
    assert ssm_state_bytes(m, 4, 2) == 494_379_008
    # an attention-only model keeps none
    assert ssm_state_bytes(load_model("llama3-8b"), 4, 2) == 0


def test_kv_bytes_count_attention_layers_only() -> None:
    m = model_from_config(BAMBA_9B_SHAPE)
    # 3 attention layers * 2 (K, V) * 8 KV heads * 128 * 2 B = 12,288 B per token (not 32 layers' 131,072)
    assert kv_bytes_per_token(m, 2) == 12_288
    # 4,096 tokens x 2 sequences: 12,288 * 4,096 * 2 = 100,663,296 B
    assert kv_cache_bytes(m, 2, 4096, 2) == 100_663_296
    # tester: 2 attention layers * 2 * 2 KV heads * 8 * 2 B = 128 B per token; 100 tokens x 2 = 25,600 B
    assert kv_cache_bytes(load_model(TESTER), 2, 100, 2) == 25_600


def test_mixer_prefill_by_hand() -> None:
    m = load_model(TESTER)
    # b 2, p 100, chunk 16 -> P 112 (7 chunks); I 64, H 16, n 16, conv_dim 96, d_conv 4, bf16:
    # half: 2*2*(100*(64 + 96 + 16) + 103*96 + 100*96) = 4*(17,600 + 9,888 + 9,600) = 148,352
    # fp32: 2*4*(112*(6*64 + 3*16*16 + 3*16*16) + 8*64*16) = 8*(112*1,920 + 8,192) = 8*223,232 = 1,785,856
    assert mixer_prefill_bytes(m, 2, 100, 2) == 148_352 + 1_785_856


def test_inference_report_holds_the_state_and_the_attention_kv() -> None:
    rep = estimate({"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
                    "inference": {"batch_size": 2, "prompt_len": 100, "new_tokens": 10}})
    pre = rep.per_gpu.breakdown_detail["kv_cache"]
    # prompt KV 25,600 B (above); state: 2 layers * 2 sequences * (96*4*2 + 16*4*16*4) = 4 * 4,864 = 19,456 B
    assert pre == {"prompt": 25_600, "mixer state (convolution and recurrent)": 19_456}
    assert rep.per_gpu.breakdown_detail["activations"]["running layer"] == 1_934_208
    assert any("Mamba2 mixers without a KV cache" in a for a in rep.assumptions)


@pytest.mark.parametrize(("extra", "where"), [
    ({"task": "serve", "serve": {"engine": "sglang"}}, "serving it with sglang is not estimated"),
    ({"task": "inference", "parallel": {"tp": 2}, "hardware": {"gpu": "A100-80GB", "num_gpus": 2}},
     "tensor parallelism is not estimated"),
    ({"task": "inference", "inference": {"kv_cache_dtype": "int8"}}, "QuantizedCache refuses"),
    ({"task": "inference", "framework": "lightning"}, "Lit-GPT ships no such model"),
])
def test_what_is_not_modelled_is_refused(extra: dict[str, object], where: str) -> None:
    doc: dict[str, object] = {"model": TESTER, "hardware": {"gpu": "A100-80GB"}, **extra}
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert where in str(exc.value)


# the tester, and a variant whose chunk (64) differs from its state size (8) so that the scan's P x l x H and
# P x H x n terms cannot stand in for each other
WIDER = {"mamba_chunk_size": 64, "mamba_d_state": 8, "hidden_size": 64, "intermediate_size": 128, "mamba_n_heads": 8}


@pytest.mark.parametrize(("changes", "prompt"), [({}, 100), (WIDER, 200)])
def test_traced_generate_agrees_with_the_analytic_engine(changes: dict[str, int], prompt: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from vramplan.trace.engine import estimate as traced

    config = json.loads(Path(TESTER).read_text())
    doc = {"task": "inference", "model": {**config, **changes}, "hardware": {"gpu": "A100-80GB"},
           "inference": {"batch_size": 2, "prompt_len": prompt, "new_tokens": 10}}
    a, t = estimate(doc).per_gpu.peak_allocated_bytes, traced(doc).per_gpu.peak_allocated_bytes
    # the analytic mixer term leaves out the einsums' transient copies and the allocator's 512 B rounding
    assert 0.95 < a / t <= 1.0


def test_kv_command_states_the_mixer_state() -> None:
    import json

    from typer.testing import CliRunner

    from vramplan.cli.main import app

    res = CliRunner().invoke(app, ["kv", TESTER, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    # 2 attention layers of 128 B per token; 2 mixers of 4,864 B (768 conv + 4,096 SSM) per sequence
    assert (doc["bytes_per_token"], doc["layers"], doc["ssm_state_bytes_per_sequence"]) == (128, 2, 9_728)


def test_mixer_decode_update_by_hand() -> None:
    from vramplan.analytic.inference import inference_step
    from vramplan.analytic.ssm_state import mixer_decode_bytes
    from vramplan.catalog.resolve import resolve

    # Bamba-9B shape, bf16: 128 heads * 64 * 128 state = 1,048,576 elements * (3*4 + 2*2) B = 16,777,216 B
    assert mixer_decode_bytes(model_from_config(BAMBA_9B_SHAPE), 1, 2) == 16_777_216
    # tester, batch 2: 16*4*16 = 1,024 elements * 16 B * 2 = 32,768 B, more than an attention layer's growth at
    # 109 tokens (2 sequences * 109 * 64 B per layer-token / 2 = 6,976 B): the decode moment holds the update
    assert mixer_decode_bytes(load_model(TESTER), 2, 2) == 32_768
    ir = inference_step(resolve({"task": "inference", "model": TESTER, "hardware": {"gpu": "A100-80GB"},
                                 "inference": {"batch_size": 2, "prompt_len": 100, "new_tokens": 10}}))
    (decode,) = [mo for mo in ir.moments if mo.phase == "decode"]
    assert decode.parts["temporaries"]["mixer state update (one layer)"] == 32_768
    assert "cache growth (torch.cat of one layer)" not in decode.parts["temporaries"]
    assert decode.parts["kv_cache"]["mixer state (convolution and recurrent)"] == 19_456


def test_bamba_without_attention_layers_counts_no_attention() -> None:
    # attn_layer_indices empty: every layer is a Mamba2 mixer; the attention projections must count zero times,
    # not once (an empty layer tuple means a global tensor to Params.add)
    import json
    from pathlib import Path

    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from vramplan.spec.hf_config import model_from_config

    cfg = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/gpu/configs/bamba-synthetic-2b.json")
                     .read_text(encoding="utf-8"))
    cfg.update(attn_layer_indices=[], num_hidden_layers=2)
    spec = model_from_config(cfg, name="bamba-no-attention")
    built = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    with torch.device("meta"):
        module = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**built))
    assert spec.num_parameters == sum(p.numel() for p in module.parameters()) == 677_704_576
