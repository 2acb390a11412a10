"""What a Mamba2 mixer's backward holds beyond its saved tensors: transformers' ``NemotronHMamba2Mixer`` (the torch
path: ``mamba2_chunk_scan``, no mamba-ssm kernels) run on the meta device under ``vramplan.trace.tracker.Tracker``,
forward then backward; the table gives, per token, the peak of the live bytes during the backward above the live bytes
at its start (all saved tensors, the output), for frozen weights (PEFT) and trained ones (full fine-tuning), bf16 or
fp32 weights under bf16 autocast (the traced engine's emulation of CUDA autocast: torch's own ``torch.autocast`` casts
no meta tensor, so a ``torch.autocast("cpu")`` region here would leave the step in fp32), against the analytic engine's
``mixer_backward_per_token`` and
``mixer_recompute_per_token`` (analytic/terms/mamba2.py), which were read off these tables; and the same for LFM2's
gated short-convolution block (``Lfm2ShortConv``).

Run: ``PYTHONPATH=src python benchmarks/mixer_backward_transient.py`` (writes ``benchmarks/mixer_backward_transient.txt``).
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path
from typing import Any

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
    return _backward_peak(lambda: NemotronHMamba2Mixer(cfg, layer_idx=0), (b, s, h), dtype, trained, autocast) / (b * s)


def _on_meta(make: Any, shape: tuple[int, int, int], dtype: torch.dtype, trained: bool,
             autocast: bool) -> tuple[torch.nn.Module, torch.Tensor, Tracker, Any]:
    """The module and an input that requires grad, on the meta device; a tracker; the autocast context (or none)."""
    with torch.device("meta"):
        module = make().to(dtype)
        x = torch.empty(*shape, dtype=dtype, requires_grad=True)
    for p in module.parameters():
        p.requires_grad_(trained)
    # torch's own autocast does nothing to meta tensors (only CUDA autocast casts, and only CUDA tensors): the traced
    # engine's emulation of CUDA autocast (vramplan.trace.cuda) casts them as a GPU step would
    cast = _cuda_autocast() if autocast else contextlib.nullcontext()
    return module, x, Tracker(), cast


@contextlib.contextmanager
def _cuda_autocast() -> Any:
    """bf16 CUDA autocast over meta tensors, as ``torch.autocast("cuda", torch.bfloat16)`` is on a GPU."""
    from vramplan.trace import cuda

    with cuda.cuda_behaviour(cuda.CudaSpec(capability=(9, 0))), cuda.autocast(torch.bfloat16):
        yield


def _backward_peak(make: Any, shape: tuple[int, int, int], dtype: torch.dtype, trained: bool,
                   autocast: bool = False) -> int:
    """A module built on the meta device, run forward then backward under the tracker: the backward's peak above its
    start (the incoming gradient included), in bytes."""
    module, x, tracker, cast = _on_meta(make, shape, dtype, trained, autocast)
    with tracker:
        with cast:
            y = module(x)
        start = tracker.live_bytes
        tracker.peak_bytes = start
        y.backward(torch.empty_like(y))
    return int(tracker.peak_bytes - start)


def forward_extra(h: int, heads: int, hd: int, groups: int, state: int, chunk: int, b: int, s: int,
                  dtype: torch.dtype, trained: bool, autocast: bool) -> int:
    """The mixer's forward peak above the live bytes at its end (what a recomputed mixer holds beyond its saved
    tensors before its backward starts), in bytes."""
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    cfg = transformers.AutoConfig.for_model(
        model_type="nemotron_h", vocab_size=100, hidden_size=h, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=64, hybrid_override_pattern="M", num_hidden_layers=1, mamba_num_heads=heads,
        mamba_head_dim=hd, n_groups=groups, ssm_state_size=state, conv_kernel=4, chunk_size=chunk)
    mixer, x, tracker, cast = _on_meta(lambda: NemotronHMamba2Mixer(cfg, layer_idx=0), (b, s, h), dtype, trained,
                                       autocast)
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
                ("fp32, autocast, trained", torch.float32, True, True, 4),
                ("bf16, autocast, frozen", torch.bfloat16, False, True, 2),
                ("bf16, autocast, trained", torch.bfloat16, True, True, 2)]
    worst = 0
    for name, dtype, trained, autocast, r in variants:
        for h, heads, hd, g, n, chunk, b, s in FORWARD_SHAPES:
            ms = MambaSpec(layers=(0,), n_heads=heads, head_dim=hd, n_groups=g, state_size=n, conv_kernel=4,
                           intermediate_size=heads * hd, chunk_size=chunk)
            got = forward_extra(h, heads, hd, g, n, chunk, b, s, dtype, trained, autocast) // (b * s)
            want = mixer_recompute_per_token(ms, h, r, not trained, b, s, autocast)
            worst = max(worst, abs(got - want))
            lines.append(f"  {name:24s} h {h:5d} I {heads * hd:5d} g {g} n {n:3d} l {chunk:3d} {b} x {s:5d}"
                         f"  {got:8d} / {want:8d}")
    lines.append(f"largest difference: {worst} B per token")
    return lines


def short_conv_transient(h: int, b: int, s: int, dtype: torch.dtype, trained: bool) -> int:
    """LFM2's gated short-convolution block (``Lfm2ShortConv``, transformers' torch ``causal_conv1d_fn``): the
    backward's peak above its start (the incoming gradient included), in bytes."""
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    cfg = transformers.AutoConfig.for_model(model_type="lfm2", vocab_size=100, hidden_size=h, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=2, full_attn_idxs=[],
                                            conv_L_cache=3)
    return _backward_peak(lambda: Lfm2ShortConv(cfg, layer_idx=0), (b, s, h), dtype, trained)


def short_conv_table() -> list[str]:
    """Each shape's measured backward peak against ``mixer_backward_per_token`` (frozen: per token; trained: the
    per-token part of two token counts, out_proj's weight gradient c h^2 being the per-layer part)."""
    from vramplan.analytic.terms.mamba2 import mixer_backward_per_token
    from vramplan.spec.model import MambaSpec

    lines = [("LFM2 convolution block: backward peak above its start, bytes per token (measured / "
             "mixer_backward_per_token)")]
    worst = 0
    for h in (256, 512, 1024):
        ms = MambaSpec(layers=(0,), n_heads=1, head_dim=h, n_groups=1, state_size=0, conv_kernel=3, intermediate_size=h,
                       chunk_size=1, kind="short_conv")
        for name, dtype, c in (("bf16", torch.bfloat16, 2), ("fp32", torch.float32, 4)):
            frozen = short_conv_transient(h, 2, 512, dtype, False) // 1024
            small, large = (short_conv_transient(h, 2, 512, dtype, True),
                            short_conv_transient(h, 1, 2048, dtype, True))
            trained = (large - small) // 1024
            want_f, want_t = mixer_backward_per_token(ms, h, c, True, c), mixer_backward_per_token(ms, h, c, False, c)
            worst = max(worst, abs(frozen - want_f), abs(trained - want_t))
            lines.append(f"  h {h:5d} {name}  frozen {frozen:7d} / {want_f:7d}   trained {trained:7d} / {want_t:7d}"
                         f"   per layer {small - 1024 * trained:9d} (c h^2 = {c * h * h})")
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
    lines.append("")
    lines += short_conv_table()
    text = "\n".join(lines) + "\n"
    OUT.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
