"""What a Mamba2 mixer's backward holds beyond its saved tensors: transformers' ``NemotronHMamba2Mixer`` (the torch
path: ``mamba2_chunk_scan``, no mamba-ssm kernels) run on the meta device under ``vramplan.trace.tracker.Tracker``,
forward then backward; the table gives, per token, the peak of the live bytes during the backward above the live bytes
at its start (all saved tensors, the output), for frozen weights (PEFT) and trained ones (full fine-tuning), bf16 or
fp32 weights under bf16 autocast.  The analytic engine counts only the incoming and outgoing residual gradients there
(analytic/terms/layers.py ``_mixer_per_token``; the report states it), which is why it refuses adapters with
checkpointing on the Mamba2 hybrids (spec/checks.py ``hybrid_peft_checkpoint_problems``) and is under the traced engine
with full fine-tuning and checkpointing (tests/test_hybrid_peft.py).

Run: ``PYTHONPATH=src python benchmarks/mixer_backward_transient.py`` (writes ``benchmarks/mixer_backward_transient.txt``).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import torch
import transformers

from vramplan.trace.tracker import Tracker

OUT = Path(__file__).resolve().parent / "mixer_backward_transient.txt"


def transient_per_token(h: int = 256, heads: int = 8, hd: int = 32, groups: int = 2, state: int = 16, chunk: int = 64,
                        b: int = 4, s: int = 512, dtype: torch.dtype = torch.bfloat16, trained: bool = False,
                        autocast: bool = False) -> float:
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    cfg = transformers.AutoConfig.for_model(
        model_type="nemotron_h", vocab_size=100, hidden_size=h, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=64, hybrid_override_pattern="M", num_hidden_layers=1, mamba_num_heads=heads,
        mamba_head_dim=hd, n_groups=groups, ssm_state_size=state, conv_kernel=4, chunk_size=chunk,
        use_mamba_kernels=False)
    with torch.device("meta"):
        mixer = NemotronHMamba2Mixer(cfg, layer_idx=0).to(dtype)
        x = torch.empty(b, s, h, dtype=dtype, requires_grad=True)
    for p in mixer.parameters():
        p.requires_grad_(trained)
    tracker = Tracker()
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with tracker:
        with cast:
            y = mixer(x)
        start = tracker.live_bytes
        tracker.peak_bytes = start
        y.backward(torch.empty_like(y))
    return (tracker.peak_bytes - start) / (b * s)


def forward_extra(h: int, heads: int, hd: int, groups: int, state: int, chunk: int, b: int, s: int,
                  dtype: torch.dtype, trained: bool, autocast: bool) -> int:
    """The mixer's forward peak above the live bytes at its end (what a recomputed mixer holds beyond its saved
    tensors before its backward starts), in bytes."""
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    cfg = transformers.AutoConfig.for_model(
        model_type="nemotron_h", vocab_size=100, hidden_size=h, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=64, hybrid_override_pattern="M", num_hidden_layers=1, mamba_num_heads=heads,
        mamba_head_dim=hd, n_groups=groups, ssm_state_size=state, conv_kernel=4, chunk_size=chunk)
    with torch.device("meta"):
        mixer = NemotronHMamba2Mixer(cfg, layer_idx=0).to(dtype)
        x = torch.empty(b, s, h, dtype=dtype, requires_grad=True)
    for p in mixer.parameters():
        p.requires_grad_(trained)
    tracker = Tracker()
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with tracker:
        with cast:
            y = mixer(x)  # held: its graph keeps the saved tensors
        extra = tracker.peak_bytes - tracker.live_bytes
    del y
    return extra


# (h, heads, head dim, groups, state, chunk, sequences, tokens each)
FORWARD_SHAPES = [(256, 8, 32, 2, 16, 64, 2, 1024), (256, 8, 32, 2, 16, 64, 4, 512), (256, 8, 32, 2, 16, 64, 1, 2048),
                  (512, 8, 32, 2, 16, 64, 2, 1024), (256, 16, 32, 2, 16, 64, 2, 1024), (256, 8, 64, 2, 16, 64, 2, 1024),
                  (256, 8, 32, 4, 16, 64, 2, 1024), (256, 8, 32, 1, 16, 64, 2, 1024), (256, 8, 32, 2, 64, 64, 2, 1024),
                  (256, 8, 32, 2, 16, 128, 2, 1024), (256, 8, 32, 2, 16, 32, 2, 1024), (384, 12, 48, 3, 32, 64, 3, 512),
                  (512, 16, 64, 2, 64, 128, 1, 2048), (1024, 32, 64, 8, 128, 128, 1, 1024)]


def forward_table() -> list[str]:
    """Each shape's measured forward peak above the end against ``mixer_recompute_per_token`` (per token, floored)."""
    from vramplan.analytic.terms.mamba2 import mixer_recompute_per_token
    from vramplan.spec.model import MambaSpec

    lines = ["recomputed forward: peak above the forward's end, bytes per token (measured / mixer_recompute_per_token)"]
    variants = [("bf16 frozen", torch.bfloat16, False, False, 2), ("bf16 trained", torch.bfloat16, True, False, 2),
                ("fp32 frozen", torch.float32, False, False, 4), ("fp32 trained", torch.float32, True, False, 4),
                ("fp32, autocast, frozen", torch.float32, False, True, 4),
                ("fp32, autocast, trained", torch.float32, True, True, 4)]
    worst = 0
    for name, dtype, trained, autocast, r in variants:
        for h, heads, hd, g, n, chunk, b, s in FORWARD_SHAPES:
            ms = MambaSpec(layers=(0,), n_heads=heads, head_dim=hd, n_groups=g, state_size=n, conv_kernel=4,
                           intermediate_size=heads * hd, chunk_size=chunk)
            got = forward_extra(h, heads, hd, g, n, chunk, b, s, dtype, trained, autocast) // (b * s)
            want = mixer_recompute_per_token(ms, h, r, not trained, b, s)
            worst = max(worst, abs(got - want))
            lines.append(f"  {name:24s} h {h:5d} I {heads * hd:5d} g {g} n {n:3d} l {chunk:3d} {b} x {s:5d}"
                         f"  {got:8d} / {want:8d}")
    lines.append(f"largest difference: {worst} B per token")
    return lines


def main() -> None:
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    rows = [("frozen, bf16", {}), ("frozen, bf16, h 512", {"h": 512}), ("frozen, bf16, I 512 (16 heads, state 64)",
            {"heads": 16, "state": 64, "s": 256}), ("frozen, bf16, chunk 128", {"chunk": 128, "s": 1024}),
            ("frozen, bf16, 4 groups", {"groups": 4}), ("frozen, fp32 weights, autocast", {"dtype": torch.float32,
            "autocast": True}), ("frozen, fp32 weights, autocast, I 512", {"dtype": torch.float32, "autocast": True,
            "heads": 16}), ("trained, bf16", {"trained": True}), ("trained, bf16, h 512", {"trained": True, "h": 512}),
            ("trained, bf16, I 512", {"trained": True, "heads": 16}), ("trained, fp32 weights, autocast",
            {"dtype": torch.float32, "autocast": True, "trained": True})]
    lines = [("case (h 256, I = 8 heads x 32 = 256, 2 groups, state 16, chunk 64, 4 x 512 tokens unless said)"
              "                 backward peak above its start, bytes per token")]
    for name, kw in rows:
        lines.append(f"{name:60s} {transient_per_token(**kw):10.1f}")
    lines.append("")
    lines.append("trained weights, split into a per-token part and a per-layer part by two token counts (2 x 512, 4 x 512):")
    for name, kw in [("bf16", {}), ("bf16, h 512", {"h": 512}), ("bf16, h 1024", {"h": 1024}),
                     ("bf16, I 512 (16 heads)", {"heads": 16}), ("bf16, I 512 (head dim 64)", {"hd": 64}),
                     ("bf16, state 64", {"state": 64}), ("bf16, 4 groups", {"groups": 4}), ("bf16, 1 group", {"groups": 1}),
                     ("bf16, chunk 128", {"chunk": 128}), ("fp32", {"dtype": torch.float32}),
                     ("fp32, h 512", {"dtype": torch.float32, "h": 512}),
                     ("fp32 weights, autocast, I 512", {"dtype": torch.float32, "autocast": True, "heads": 16})]:
        small = transient_per_token(b=2, trained=True, **kw) * 1024
        large = transient_per_token(b=4, trained=True, **kw) * 2048
        slope = (large - small) / 1024
        lines.append(f"  {name:58s} per token {slope:8.1f}   per layer {large - 2048 * slope:10.0f}")
    lines.append("")
    lines.append("frozen weights: r h + 20 I - 4 g bytes per token (the output's gradient in the block input's dtype r, "
                 "five fp32 I-wide gradients, less the fp32 rsqrt per group freed before the peak)")
    lines.append("trained weights: r h + (16 - r) I - 4 g bytes per token, and w I (h + 1) per layer (out_proj's and the "
                 "gated norm's weight gradients in the weights' dtype w: the gradients' term) "
                 "(analytic/terms/mamba2.py mixer_backward_per_token)")
    lines.append("")
    lines += forward_table()
    text = "\n".join(lines) + "\n"
    OUT.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
