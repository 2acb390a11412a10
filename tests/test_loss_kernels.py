"""train.loss: Liger's fused linear cross-entropy, Cut Cross-Entropy and torchtune's chunked loss
(analytic/logits.py, terms/loss.py), train.packing; their refusals in the traced engine and the export.

Llama-3-8B throughout: V = 128,256, H = 4096, 32 layers.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vramplan.alloc import replay
from vramplan.analytic.events import train_run_events
from vramplan.analytic.logits import (
    cce_bytes,
    chunked_ce_bytes,
    liger_chunk_rows,
    liger_flce_bytes,
    loss_bytes,
    next_power_of_2,
)
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import bytes_of
from vramplan.analytic.train import train_step
from vramplan.catalog.resolve import resolve
from vramplan.errors import ScenarioError

V, H = 128_256, 4096


def scenario(**train: Any) -> dict[str, Any]:
    t = {"micro_batch_size": 1, "seq_len": 2048, **train}
    return {"model": "meta-llama/Meta-Llama-3-8B", "hardware": {"gpu": "h100-80gb"}, "framework": "plain",
            "train": t}


def test_liger_chunk_size_follows_its_source() -> None:
    # inc_factor = cdiv(V, H); chunk = next_power_of_2(cdiv(BT, inc_factor)) (Liger 0.8.2)
    assert [next_power_of_2(n) for n in (0, 1, 3, 64, 65)] == [1, 1, 4, 64, 128]
    assert liger_chunk_rows(16_384, 32_000, 4096) == 2048  # the source's comment: inc 8, 16384 / 8
    assert liger_chunk_rows(2048, V, H) == 64  # inc cdiv(128256, 4096) = 32; 2048 / 32 = 64
    assert liger_chunk_rows(3, 4096, 4096) == 3  # next_power_of_2(3) = 4 rows asked, 3 exist


def test_liger_bytes_by_hand() -> None:
    # bf16-mixed full fine-tuning: hidden states fp32 (x 4), logits bf16 (c 2), head gradient fp32 (w 4)
    lt = liger_flce_bytes(2048, V, H, 4, 2, 4)
    # saved: grad_input 2048 x 4096 x 4 = 33,554,432 + grad_weight 128,256 x 4096 x 4 = 2,101,346,304
    assert lt.saved == 33_554_432 + 2_101_346_304 == 2_134_900_736
    # forward: loss_1d 4 x 2048 = 8,192 + 64 rows x (128,256 + 4096) x 2 = 16,941,056
    assert lt.forward_extra == 8_192 + 16_941_056
    assert lt.backward_extra == 0  # the backward scales the kept gradients in place
    # without addmm's out_dtype (bf16 head gradient, or sm < 8): torch.mm's V H c and its .float() V H 4
    mm = liger_flce_bytes(2048, V, H, 2, 2, 2, addmm_out_dtype=False)
    assert mm.forward_extra == 8_192 + 64 * V * 2 + V * H * (2 + 4) == 3_168_444_416
    # a frozen head (LoRA): no grad_weight, so no weight-update temporaries either
    lora = liger_flce_bytes(2048, V, H, 2, 2, 0, addmm_out_dtype=False)
    assert (lora.saved, lora.forward_extra) == (2048 * H * 2, 8_192 + 64 * (V + H) * 2) == (16_777_216, 16_949_248)


def test_cce_bytes_by_hand() -> None:
    c = cce_bytes(2048, V, H, 4, 2, 4, head_trainable=True)
    # saved: e cast 2048 x 4096 x 2 = 16,777,216; c cast 128,256 x 4096 x 2 = 1,050,673,152; lse 8,192;
    # logit_avg 4 x 128,256 = 513,024
    assert c.saved == 16_777_216 + 1_050_673_152 + 8_192 + 513_024 == 1_067_971_584
    # backward: argsort 8 V = 1,026,048 + de 16,777,216 + max(dc 1,050,673,152 + dc.to(fp32) 2,101,346,304,
    # dc fp32 2,101,346,304 + de.to(fp32) 33,554,432)
    assert c.forward_extra == 4 * 2048  # neg_dot (then the per-token loss, in place), fp32
    assert c.backward_extra == 1_026_048 + 16_777_216 + 3_152_019_456 == 3_169_822_720
    # bf16-true, frozen head: nothing is cast, no dc
    t = cce_bytes(2048, V, H, 2, 2, 2, head_trainable=False)
    assert (t.saved, t.backward_extra) == (16_777_216 + 8_192 + 513_024, 1_026_048 + 16_777_216)


def test_chunked_bytes_by_hand() -> None:
    k = chunked_ce_bytes(2048, 256, V, 2)
    assert k.saved == 4 * V * 2048 == 1_050_673_152  # every chunk's fp32 log-probs
    # the bf16 logits 525,336,576 + the last chunk's fp32 copy 4 x 128,256 x 256 = 131,334,144
    assert k.forward_extra == 525_336_576 + 131_334_144
    # first chunk's backward: nll_loss's and log_softmax's gradients, 8 x 128,256 x 256
    assert k.backward_extra == 262_668_288
    # the standard loss holds 10 V T forward and 12 V T backward: the chunked one 6.5 and 5 V T
    assert k.forward_peak * 2 == 13 * V * 2048 and k.backward_peak == 5 * V * 2048


@pytest.mark.parametrize("loss", ["liger-fused-linear-ce", "cut-cross-entropy", "chunked"])
def test_the_step_carries_the_kernel_term(loss: str) -> None:
    # LoRA (frozen bf16 base: hidden states x = 2, head frozen), bf16-mixed: c = 2
    tr = train_step(resolve(scenario(peft={"method": "lora"}, loss=loss)))
    forward = bytes_of(tr.terms, "logits.kernel_loss")
    backward = bytes_of(tr.terms, "logits.kernel_loss_gradients")
    assert bytes_of(tr.terms, "logits.loss") == 0
    expected = {
        # liger: grad_input 16,777,216 + loss_1d 8,192 + 64 x 132,352 x 2 = 16,941,056
        "liger-fused-linear-ce": (33_726_464, 16_777_216),
        # cce: e 16,777,216 + lse 8,192 + logit_avg 513,024 (the bf16 base head is not cast); backward + 8 V + de
        "cut-cross-entropy": (17_298_432 + 8_192, 17_298_432 + 1_026_048 + 16_777_216),
        # chunked: 2 V T + 4 V T + 4 V T / 8; backward 4 V T + 8 V T / 8
        "chunked": (1_707_343_872, 1_313_341_440),
    }[loss]
    assert (forward, backward) == expected


def test_fused_kernels_keep_no_head_input() -> None:
    # full fine-tuning: the head's nn.Linear saves its bf16 input (2 x 4096 x 2048 = 16,777,216); Liger's and
    # CCE's functions take the hidden states themselves
    std = bytes_of(train_step(resolve(scenario())).terms, "saved.head")
    liger = bytes_of(train_step(resolve(scenario(loss="liger-fused-linear-ce"))).terms, "saved.head")
    chunked = bytes_of(train_step(resolve(scenario(loss="chunked"))).terms, "saved.head")
    assert std - liger == 2 * H * 2048 == 16_777_216
    assert chunked == std  # torchtune's head chunks save views of the one hidden-state tensor


def test_the_report_shows_the_kernel_under_the_loss_keys() -> None:
    tr = train_step(resolve(scenario(peft={"method": "lora"}, loss="liger-fused-linear-ce",
                                     micro_batch_size=4, seq_len=4096, gradient_checkpointing="full")))
    at_loss = [mo for mo in tr.moments if mo.get(K.LOSS_BACKWARD)]
    assert at_loss and all(mo.get(K.LOSS_BACKWARD) == 16_384 * H * 2 for mo in at_loss)
    assert any("Liger-Kernel 0.8.2" in a for a in tr.assumptions)


def test_the_event_stream_allocates_the_kernel_tensors() -> None:
    tr = train_step(resolve(scenario(peft={"method": "lora"}, loss="cut-cross-entropy")))
    assert tr.layout is not None
    kept = 17_298_432
    assert tr.layout.kernel_loss == (kept, 8_192, 1_026_048 + 16_777_216)
    assert (tr.layout.logits, tr.layout.logits_fp32, tr.layout.log_probs) == (0, 0, 0)
    res = replay(train_run_events(tr.layout))
    assert abs(res.peak_allocated_bytes / tr.peak.total - 1) < 0.01


@pytest.mark.parametrize(("train", "extra", "field", "needle"), [
    ({"loss": "liger-fused-linear-ce"}, {"framework": "torchtitan"}, "train.loss", "not available under"),
    ({"loss": "chunked"}, {"framework": "hf-trainer"}, "train.loss", "not available under"),
    ({"loss": "cut-cross-entropy"}, {"hardware": {"gpu": "h100-80gb", "num_gpus": 2}, "parallel": {"tp": 2}},
     "train.loss", "vocabulary-parallel"),
    ({"packing": True}, {}, "train.packing", "find_packed_sequence_indices"),
])
def test_refused_combinations(train: dict[str, Any], extra: dict[str, Any], field: str, needle: str) -> None:
    with pytest.raises(ScenarioError) as err:
        resolve({**scenario(**train), **extra})
    assert any(p.where == field and needle in p.message for p in err.value.problems)


def test_packing_with_flash_changes_no_byte() -> None:
    # under flash no mask is saved with or without packing (activations.py shared_saved_per_token)
    a = train_step(resolve(scenario(attention="flash")))
    b = train_step(resolve(scenario(attention="flash", packing=True)))
    assert a.peak.total == b.peak.total
    assert any(x.startswith("packed sequences") for x in b.assumptions)


@pytest.mark.parametrize(("train", "field"), [
    ({"loss": "liger-fused-linear-ce"}, "train.loss"), ({"loss": "cut-cross-entropy"}, "train.loss"),
    ({"loss": "chunked"}, "train.loss"), ({"liger_kernels": True}, "train.liger_kernels"),
    ({"activation_offload": "cpu", "gradient_checkpointing": "full"}, "train.activation_offload"),
    ({"torchao_cpu_offload": "optimizer", "precision": "bf16-true"}, "train.torchao_cpu_offload"),
])
def test_the_trace_refuses_what_it_cannot_run(train: dict[str, Any], field: str) -> None:
    from vramplan.trace.engine import trace

    with pytest.raises(ScenarioError) as err:
        trace(scenario(**train))
    assert err.value.problems[0].where == field
    assert "not traced" in err.value.problems[0].message


def test_export_flags() -> None:
    from vramplan.export import _loss_arguments

    args = _loss_arguments("liger-fused-linear-ce", False)
    assert args["use_liger_kernel"] is True and args["liger_kernel_config"]["fused_linear_cross_entropy"] is True
    assert not any(v for k, v in args["liger_kernel_config"].items() if k != "fused_linear_cross_entropy")
    assert _loss_arguments("standard", False) == {}
    kernels = _loss_arguments("standard", False, liger_kernels=True)["liger_kernel_config"]
    assert kernels == {"fused_linear_cross_entropy": False, "cross_entropy": False, "rms_norm": True,
                       "swiglu": True, "rope": True}
    for loss, packing in (("cut-cross-entropy", False), ("chunked", False), ("standard", True),
                          ("liger-fused-linear-ce", True)):
        with pytest.raises(ScenarioError):
            _loss_arguments(loss, packing)
    with pytest.raises(ScenarioError, match="activation_offloading"):
        _loss_arguments("standard", False, offload=True)


def test_activation_offload_by_hand() -> None:
    # LoRA on Llama-3-8B, full checkpointing, 1 x 2048 tokens: each layer keeps its input, the bf16 residual of a
    # frozen bf16 base: 2048 x 4096 x 2 = 16,777,216 B (2^24, so the pinned allocator's power-of-two rounding adds
    # nothing); 32 layers = 536,870,912 B in host memory
    base = scenario(peft={"method": "lora"}, gradient_checkpointing="full")
    off = train_step(resolve({**base, "train": {**base["train"], "activation_offload": "cpu"}}))
    ref = train_step(resolve(base))
    assert off.host_bytes - ref.host_bytes == 32 * 16_777_216 == 536_870_912
    assert bytes_of(off.terms, "saved.offloaded", where="host") == 536_870_912
    # at the loss, no layer input is on the GPU any more: the device's saved tensors drop by all 32
    loss_ref = next(mo for mo in ref.moments if mo.get(K.LOSS_BACKWARD))
    loss_off = next(mo for mo in off.moments if mo.get(K.LOSS_BACKWARD))
    assert loss_ref.get(K.SAVED) - loss_off.get(K.SAVED) == 536_870_912
    # in the backward of the last layer only its own input is back (and being recomputed from)
    assert off.peak.total < ref.peak.total
    # the event stream frees the inputs after the forward and brings each back for its backward
    assert off.layout is not None and off.layout.offload_inputs
    res = replay(train_run_events(off.layout))
    assert abs(res.peak_allocated_bytes / off.peak.total - 1) < 0.01
    assert any("OffloadActivations" in a for a in off.assumptions)


def test_pinned_rounding() -> None:
    from vramplan.analytic.terms.saved import offloaded_inputs

    # 3 x 2^20 + 1 rounds to 2^22; 2^24 stays (CachingHostAllocator PowerOf2Ceil)
    assert offloaded_inputs([3 * 2**20 + 1, 2**24, 0]).nbytes == 2**22 + 2**24


@pytest.mark.parametrize(("train", "extra"), [
    ({"activation_offload": "cpu"}, {}),  # no checkpointing
    ({"activation_offload": "cpu", "gradient_checkpointing": "full"}, {"framework": "torchtitan"}),
])
def test_offload_refusals(train: dict[str, Any], extra: dict[str, Any]) -> None:
    with pytest.raises(ScenarioError) as err:
        resolve({**scenario(**train), **extra})
    assert any(p.where == "train.activation_offload" for p in err.value.problems)


def test_liger_kernels_by_hand() -> None:
    # Llama-3-8B full fine-tuning, bf16-mixed (fp32 residual r = 4, c = 2), sdpa, no checkpointing, per token
    # and layer: transformers' two RMSNorms save 4 + 4 B per element each (fp32 x, the normalized x for the
    # weight), Liger's the input only (4): 2 x 4 x 4096 = 32,768 B less; the SwiGLU keeps gate and up (2 x 2)
    # instead of gate, silu and up (3 x 2): 2 x 14,336 = 28,672 B less.  61,440 B per token per layer.
    std = train_step(resolve(scenario()))
    lig = train_step(resolve(scenario(liger_kernels=True)))
    kept_std = bytes_of(std.terms, "saved.kept")
    kept_lig = bytes_of(lig.terms, "saved.kept")
    assert kept_std - kept_lig == 32 * 2048 * (32_768 + 28_672) == 4_026_531_840
    # the final norm too: 4 x 4096 x 2048 = 33,554,432 B less in saved.head
    assert bytes_of(std.terms, "saved.head") - bytes_of(lig.terms, "saved.head") == 33_554_432
    # the MLP's backward: the product's gradient only (Liger writes the other two into its saved inputs):
    # 2 x 2 x 14,336 x 2048 = 117,440,512 B less at the MLP's backward
    from vramplan.analytic.terms.context import StepContext
    from vramplan.analytic.terms.layers import layer_activations

    def mlp_transient(r: Any) -> int:
        return max(layer_activations(StepContext(r, 0, "flash", False)).mlp_transient)

    assert mlp_transient(resolve(scenario())) - mlp_transient(resolve(scenario(liger_kernels=True))) == 117_440_512


def test_liger_kernels_refused_where_not_modelled() -> None:
    with pytest.raises(ScenarioError) as err:
        resolve({**scenario(liger_kernels=True), "model": "gpt2"})
    assert any(p.where == "train.liger_kernels" for p in err.value.problems)


def test_evaluation_runs_the_standard_loss() -> None:
    # outside training Liger's forward materializes the logits: the evaluation forward's head tensors are the
    # standard loss's, 2 V T + 4 V T + 4 V T at 2048 tokens, whatever train.loss says
    from vramplan.analytic.lifecycle.evaluation import _head_tensors

    std, lig = train_step(resolve(scenario())), train_step(resolve(scenario(loss="liger-fused-linear-ce")))
    assert std.layout is not None and lig.layout is not None and lig.context is not None
    vt = V * 2048
    assert _head_tensors(lig.context, lig.layout) == (std.layout.logits, std.layout.logits_fp32,
                                                      std.layout.log_probs) == (2 * vt, 4 * vt, 4 * vt)


def test_cce_against_its_published_benchmark() -> None:
    # ml-cross-entropy README ("Expected output with A100 SMX4, PyTorch 2.4.1, and CUDA 12.4"), test data gemma2:
    # 8192 tokens, Gemma 2 2B's V = 256,000 and D = 2304, bf16 embeddings and classifier, both requiring grad.
    # op_mem_mb is the peak allocated bytes over the operation minus those before it, in MiB
    # (benchmark/memory.py mem_delta): "cce loss-bw 1163.0" and "cce loss-fw 1.1".
    c = cce_bytes(8192, 256_000, 2304, 2, 2, 2, head_trainable=True)
    # backward: argsort 8 x 256,000 = 2,048,000 + de 8192 x 2304 x 2 = 37,748,736 + dc 256,000 x 2304 x 2
    # = 1,179,648,000 -> 1,219,444,736 B = 1162.95 MiB against 1163.0 printed (0.004%)
    assert c.backward_extra == 1_219_444_736
    assert abs(c.backward_extra / 2**20 - 1163.0) < 0.05
    # forward, beyond the inputs: lse 32,768 + logit_avg 1,024,000 + neg_dot 32,768 = 1,089,536 B = 1.04 MiB
    # against 1.1 printed (one decimal; the valid-token index built from the targets is not counted)
    fwd = c.saved - 8192 * 2304 * 2 + c.forward_extra
    assert fwd == 1_089_536 and round(fwd / 2**20, 1) == 1.0


@settings(max_examples=60, deadline=None)
@given(tokens=st.integers(1, 1 << 20), vocab=st.integers(2, 300_000), hidden=st.integers(64, 16_384))
def test_liger_chunk_logits_stay_near_the_hidden_states(tokens: int, vocab: int, hidden: int) -> None:
    # rows = next_power_of_2(cdiv(BT, cdiv(V, H))) <= 2 cdiv(BT, V / H): a chunk's logits are at most about twice
    # the hidden states (the point of Liger's chunk size), and never more rows than tokens
    rows = liger_chunk_rows(tokens, vocab, hidden)
    assert 1 <= rows <= tokens
    assert rows * vocab <= 2 * (tokens * hidden + vocab)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 16), s=st.integers(8, 65_536), vocab=st.integers(2, 300_000), c=st.sampled_from([2, 4]))
def test_chunked_never_exceeds_the_standard_loss(b: int, s: int, vocab: int, c: int) -> None:
    # the same tensors, the fp32 copy and the backward's gradients made one chunk at a time: never more
    tokens, chunk = b * s, b * -(-s // 8)
    k = chunked_ce_bytes(tokens, min(chunk, tokens), vocab, c)
    std = loss_bytes(tokens, vocab, c)
    assert k.forward_peak <= std.forward_peak
    assert k.backward_peak <= std.backward_peak
