"""Beam search in Hugging Face generate (``inference.num_beams``, analytic/inference.py and encoder_decoder.py): every
tensor of the call over batch x num_beams rows, the step's log-probabilities and the beams' buffers, by hand; the
encoder of an encoder-decoder model over the prompts alone; and the paths that refuse it."""

from __future__ import annotations

from typing import Any

import pytest

from vramplan.analytic.generate import generate_step
from vramplan.analytic.inference import beam_state_bytes
from vramplan.analytic.moment import K
from vramplan.catalog.resolve import resolve
from vramplan.engine import estimate
from vramplan.errors import ScenarioError

LLAMA2 = {"model": "meta-llama/Llama-2-7b-hf", "task": "inference", "hardware": {"gpu": "A100-80GB"},
          "inference": {"batch_size": 8, "prompt_len": 1024, "new_tokens": 512, "dtype": "bf16"}}
# google-t5/t5-small's shape (tests/test_families_encdec.py)
T5_SMALL: dict[str, Any] = {"model_type": "t5", "d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8,
                            "d_kv": 64, "vocab_size": 32128, "feed_forward_proj": "relu"}


def _doc(base: dict[str, Any], **inference: Any) -> dict[str, Any]:
    return {**base, "inference": {**base["inference"], **inference}}


def test_beam_state_by_hand() -> None:
    # 8 rows, L = 1,024, G = 512 generated: before the prefill 16 x 8 x 1,024 + 8 x 8 x 512 = 131,072 + 32,768;
    # at a step's update of the finished beams 72 x 8 x 1,024 + 32 x 8 x 512 = 589,824 + 131,072
    assert beam_state_bytes(8, 1024, 512, decode=False) == 163_840
    assert beam_state_bytes(8, 1024, 512, decode=True) == 720_896


def test_llama2_beams_by_hand() -> None:
    one = estimate(LLAMA2).per_gpu.breakdown_detail
    four = estimate(_doc(LLAMA2, num_beams=4)).per_gpu.breakdown_detail
    # 8 prompts x 4 beams = 32 rows; the last decode step's cache holds 1,024 + 512 - 1 = 1,535 tokens of
    # 32 layers x 2 x 4,096 x 2 B = 524,288 B per token and row
    assert one["kv_cache"]["all tokens"] == 8 * 1535 * 524_288 == 6_438_256_640
    assert four["kv_cache"]["all tokens"] == 32 * 1535 * 524_288 == 25_753_026_560
    # one layer's keys at 1,535 tokens, old and new together: 32 x 1,535 x 4,096 x 2 B
    assert four["temporaries"]["cache growth (torch.cat of one layer)"] == 402_391_040
    # logits per row and vocabulary entry: bf16 2 + fp32 copy 4 + warpers 26 + beam search's log_softmax 4 = 36 B;
    # 32 x 32,000 x 36 (one beam: 8 x 32,000 x 32)
    assert one["temporaries"]["last-token logits and sampling"] == 8_192_000
    assert four["temporaries"]["last-token logits and sampling"] == 36_864_000
    # the beams' buffers: 72 x 32 x 1,536 + 32 x 32 x 512 = 3,538,944 + 524,288
    assert four["temporaries"]["beam search sequences and indices"] == 4_063_232
    assert "beam search sequences and indices" not in one["temporaries"]


def test_beams_are_stated_and_the_replay_is_not_applied() -> None:
    rep = estimate(_doc(LLAMA2, num_beams=4))
    assert any(a.startswith("beam search, 4 beams: every tensor of the call over 8 x 4 = 32 rows")
               for a in rep.assumptions)
    # the allocator replay of generate's cache growth has no reorder_cache copies: the packed note instead
    assert any("not replayed" in a for a in rep.assumptions)
    assert not any(a.startswith("beam search") for a in estimate(LLAMA2).assumptions)


def test_encoder_runs_over_the_prompts_and_its_output_is_repeated() -> None:
    base = {"model": T5_SMALL, "task": "inference", "hardware": {"gpu": "A100-80GB"},
            "inference": {"batch_size": 2, "prompt_len": 512, "new_tokens": 64, "dtype": "bf16"}}
    one, three = generate_step(resolve(base)), generate_step(resolve(_doc(base, num_beams=3)))
    enc1 = [p for p in one.moments if p.phase == "encoder"]
    enc3 = [p for p in three.moments if p.phase == "encoder"]
    # the encoder's moments are the same (it runs before _expand_inputs_for_generation); beam search adds one: the
    # output of 2 prompts and its copy for 6 rows together, (2 + 6) x 512 x 512 x 2 B = 4,194,304 B
    assert enc3[:len(enc1)] == enc1
    expand = K.ENCODER_OUTPUT_EXPAND.name()
    assert enc3[-1].parts["activations"][expand] == 4_194_304
    # every later moment holds the repeated output: 6 x 512 x 512 x 2 = 3,145,728 B
    decode = next(p for p in three.moments if p.phase == "decode")
    assert decode.parts["activations"][K.ENCODER_OUTPUT.name()] == 3_145_728
    # and the beams' buffers of the decoder's L = 64 + 1 tokens (decoder_start_token_id), G = 64:
    # 72 x 6 x 65 + 32 x 6 x 64 = 28,080 + 12,288
    assert decode.parts["temporaries"][K.BEAM_STATE.name()] == 40_368


@pytest.mark.parametrize("doc", [
    {**_doc(LLAMA2, num_beams=2), "framework": "lightning"},  # Lit-GPT's generate samples one sequence per prompt
    {**_doc(LLAMA2, num_beams=2, quantization="awq-4bit", dtype="fp16"), "framework": "autoawq"},
], ids=["lightning", "autoawq"])
def test_paths_without_beam_search_refuse_it(doc: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(doc)
    assert "inference.num_beams" in [p.where for p in exc.value.problems]


def test_the_trace_refuses_beam_search() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import trace

    with pytest.raises(ScenarioError) as exc:
        trace(_doc(LLAMA2, num_beams=2))
    assert [p.where for p in exc.value.problems] == ["inference.num_beams"]


def test_fewer_beams_is_a_verified_remedy() -> None:
    from vramplan.plan.remedies import remedies

    # 8 prompts x 16 beams = 128 rows: the cache alone is 128 x 1,535 x 524,288 B = 103.0 GB on an 80 GB A100;
    # 8 beams halve it (51.5 GB + 13.5 GB of weights fit within the planner's 10% margin)
    doc = _doc(LLAMA2, num_beams=16)
    beams = [x for x in remedies(doc) if x.kind == "beams"]
    assert [x.change for x in beams] == [{"inference.num_beams": 8}]
    assert beams[0].text == "inference.num_beams 16 -> 8"
