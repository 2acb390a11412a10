"""The training loss of older transformers releases (``software.transformers``, analytic/logits.py).

Read off the release wheels: ``LlamaForCausalLM.forward`` of 4.31-4.45 did ``logits = logits.float()`` and
``shift_logits = logits[..., :-1, :].contiguous()`` (4.30.2 had no upcast); ``ForCausalLMLoss`` of 4.46-4.48
upcast and still shifted; 4.49 pads the labels instead.  GPT-2, GPT-J, GPT-NeoX, Falcon, BLOOM and OPT kept
their own CrossEntropyLoss on the shifted logits, without upcast, until 4.49.
"""

from __future__ import annotations

import pytest

from vramplan.analytic.logits import family_loss_release, loss_bytes, loss_release
from vramplan.catalog import load_model
from vramplan.engine import estimate

# Qwen2.5-0.5B's vocabulary, micro-batch 2 x 512 tokens: v = 1024 x 151,936 = 155,582,464 logits,
# vs = 2 x 511 x 151,936 = 155,278,592 shifted logits
T, V, B, S = 1024, 151_936, 2, 512
v, vs = T * V, B * (S - 1) * V


def test_the_release_ranges() -> None:
    assert [loss_release(x, True, (4, 46)) for x in [(4, 30, 2), (4, 31), (4, 45, 2), (4, 46), (4, 48), (4, 49), None]] \
        == ["shifted_no_upcast", "shifted_upcast_in_model", "shifted_upcast_in_model", "shifted", "shifted",
            "padded", "padded"]
    # GPT-2's forward called its own CrossEntropyLoss until 4.49
    gpt2 = load_model("gpt2").traits
    assert family_loss_release((4, 47), gpt2, "hf-trainer") == "shifted_no_upcast"
    assert family_loss_release((4, 49), gpt2, "hf-trainer") == "padded"
    # torchtitan runs its own model and loss: the transformers release does not apply
    assert family_loss_release((4, 40), load_model("Qwen/Qwen2.5-0.5B").traits, "torchtitan") == "padded"


def test_loss_bytes_per_release_by_hand() -> None:
    # current: bf16 logits 2v + fp32 copy 4v + log-probs 4v forward = 10 v; backward 12 v
    assert loss_bytes(T, V, 2).forward_peak == 10 * v == 1_555_824_640
    # 4.46-4.48: 2v + 4v + shifted copy 4vs + log-probs 4vs = 2,175,723,520; backward 12 vs
    lt = loss_bytes(T, V, 2, release="shifted", shifted_tokens=B * (S - 1))
    assert (lt.forward_peak, lt.backward_peak) == (6 * v + 8 * vs, 12 * vs) == (2_175_723_520, 1_863_343_104)
    # 4.31-4.45 (Llama kin): the model output is the fp32 logits 4v (bf16 head output freed at the cast)
    lt = loss_bytes(T, V, 2, release="shifted_upcast_in_model", shifted_tokens=B * (S - 1))
    assert lt.forward_peak == 4 * v + 8 * vs == 1_864_558_592
    assert lt.forward_tensors == (4 * v, 4 * vs, 4 * vs)
    # no upcast, autocast: 2v + shifted 2vs + autocast's fp32 copy 4vs + fp32 log-probs 4vs; backward 3 x 4 vs
    lt = loss_bytes(T, V, 2, release="shifted_no_upcast", shifted_tokens=B * (S - 1))
    assert (lt.forward_peak, lt.backward_peak) == (2 * v + 10 * vs, 12 * vs) == (1_863_950_848, 1_863_343_104)
    # no upcast, true bf16: log_softmax in bf16: 2v + 2vs + 2vs forward, 3 x 2 vs backward
    lt = loss_bytes(T, V, 2, release="shifted_no_upcast", shifted_tokens=B * (S - 1), autocast=False)
    assert (lt.forward_peak, lt.backward_peak) == (2 * v + 4 * vs, 6 * vs) == (932_279_296, 931_671_552)
    for lt in (loss_bytes(T, V, 2, release=r, shifted_tokens=B * (S - 1))  # type: ignore[arg-type]
               for r in ("padded", "shifted", "shifted_upcast_in_model", "shifted_no_upcast")):
        assert sum(lt.forward_tensors) == lt.forward_peak


def _lora(version: str | None, **train: object) -> dict[str, object]:
    # the loss alone differs between these releases: no training-forward cache (use_cache off) and the
    # flash-attention package, which takes grouped K/V itself (SDPA before 4.54 repeats them: tests/test_sdpa_repeat_kv.py)
    return {"model": "Qwen/Qwen2.5-0.5B", "hardware": {"gpu": "H100"}, "software": {"transformers": version},
            "train": {"seq_len": S, "micro_batch_size": B, "peft": {"rank": 8}, "use_cache": False,
                      "attention": "flash", **train}}


def test_the_release_changes_the_estimate_and_says_so() -> None:
    now = estimate(_lora(None))
    assert now.per_gpu.peak_allocated_bytes == estimate(_lora("4.49")).per_gpu.peak_allocated_bytes
    old = estimate(_lora("4.47"))
    # the shifted copy and the kept fp32 logits make 4.46-4.48's forward peak the step's peak
    assert old.per_gpu.peak_allocated_bytes > now.per_gpu.peak_allocated_bytes
    assert any("ForCausalLMLoss (4.46-4.48)" in a for a in old.assumptions)
    assert any("(4.31-4.45)" in a for a in estimate(_lora("4.45")).assumptions)
    tt = estimate({**_lora("4.40"), "framework": "torchtitan"})
    assert any(a.startswith("not modelled: software.transformers 4.40") for a in tt.assumptions)


# Qwen2 first shipped in transformers 4.37 (facts/transformers.py), so 4.30's loss runs on a Llama-kin model
@pytest.mark.parametrize(("version", "model"), [("4.47", "Qwen/Qwen2.5-0.5B"), ("4.45", "Qwen/Qwen2.5-0.5B"),
                                                ("4.30", "TinyLlama/TinyLlama-1.1B-Chat-v1.0"),
                                                ("4.30", "HuggingFaceTB/SmolLM-135M")])
def test_the_trace_runs_the_release_loss(version: str, model: str) -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as trace_estimate

    # the traced engine runs no flash-attention package, and under SDPA the analytic engine's K/V repeated by releases
    # before 4.54 would be what differs: these grouped-query models run eager attention, K/V repeated in both engines
    doc = {**_lora(version, attention="eager"), "model": model}
    a, t = estimate(doc), trace_estimate(doc)
    # measured 2026-11, H100: 0.023 %, 0.025 % apart (Qwen2.5-0.5B 4.47, 4.45), 0.056 % (TinyLlama 4.30),
    # 0.079 % (SmolLM-135M 4.30).  These releases peak in the forward (the loss), where the trace held one
    # cuBLAS workspace of two until the autograd thread's was counted from the step's start (0.75 %, 0.74 %
    # and 2.1 % apart before: 32 MiB, whatever the model)
    assert abs(a.per_gpu.peak_allocated_bytes / t.per_gpu.peak_allocated_bytes - 1) < 0.002
    assert any(f"loss as transformers {version}" in n for n in t.assumptions)


def test_a_forward_peak_holds_both_cublas_workspaces() -> None:
    pytest.importorskip("torch")
    from vramplan.trace.engine import estimate as trace_estimate

    # the steady step: the autograd thread's workspace (made in the previous backward, kept in PyTorch's
    # (handle, stream) map) is alive in the forward too.  H100 (Hopper): CUBLAS_WORKSPACE_CONFIG :4096:8 =
    # 8 x 4096 KiB = 33,554,432 B each, 67,108,864 B for the two, as the analytic engine's resident term
    doc = {**_lora("4.30"), "model": "HuggingFaceTB/SmolLM-135M"}
    t = trace_estimate(doc)
    assert t.per_gpu.phases["forward"] == t.per_gpu.peak_allocated_bytes  # 4.30's loss peaks in the forward
    other = t.per_gpu.breakdown_detail["other"]
    assert other["cuBLAS workspace (forward)"] == other["cuBLAS workspace (autograd thread)"] == 33_554_432
    assert estimate(doc).per_gpu.breakdown_detail["other"]["cuBLAS workspaces"] == 67_108_864
