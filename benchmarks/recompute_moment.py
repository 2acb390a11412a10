"""LoRA and QLoRA (peft) with full checkpointing: where the analytic engine's peak stands against the traced engine's,
which runs transformers' and peft's own layers on the meta device, when the loss moment does not dominate.

Llama-2-7B's layer dimensions (h 4,096, I 11,008, 32 heads), two layers, LoRA rank 16 on every linear (with and
without LoRA dropout) or on q_proj and v_proj, bf16-mixed, micro-batch 1 x 2,048 tokens.  With the model's own vocabulary (32,000) the loss moment's logits are the peak and the
two engines agree; with a 1,024-token vocabulary (what a fused or chunked loss leaves of the logits) the traced engine
peaks inside the recomputed layer, at its down projection: the analytic engine models that moment where the down
projection carries an adapter (analytic/activations.py ``recompute_forward_bytes``) and states it elsewhere
(analytic/train.py ``RECOMPUTE_MOMENT_NOTE``, the band widened).

Run: ``PYTHONPATH=src HF_HUB_OFFLINE=1 python benchmarks/recompute_moment.py`` (writes
``benchmarks/recompute_moment.txt``; about a minute).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vramplan import estimate
from vramplan.trace import estimate as trace_estimate

OUT = Path(__file__).resolve().parent / "recompute_moment.txt"
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def scenario(method: str, vocab: int, targets: list[str] = ALL, dropout: float = 0.0) -> dict[str, Any]:
    model = {"model_type": "llama", "vocab_size": vocab, "hidden_size": 4096, "intermediate_size": 11008,
             "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 2,
             "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu",
             "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    train: dict[str, Any] = {"micro_batch_size": 1, "seq_len": 2048, "gradient_checkpointing": "full",
                             "precision": "bf16-mixed",
                             "peft": {"method": method, "rank": 16, "target_modules": targets, "dropout": dropout}}
    if method == "qlora":
        train["quantization"] = "nf4"
    return {"model": model, "task": "train", "hardware": {"gpu": "A100-80GB"}, "train": train}


def main() -> None:
    lines = ["method  vocab  targets       analytic_peak_B  traced_peak_B  analytic/traced  traced_phase"]
    for method in ("lora", "qlora"):
        for vocab in (32000, 1024):
            for name, targets, dropout in (("all-linear", ALL, 0.0), ("all, drop .05", ALL, 0.05),
                                           ("q,v", ["q_proj", "v_proj"], 0.0)):
                doc = scenario(method, vocab, targets, dropout)
                a, t = estimate(doc).per_gpu, trace_estimate(doc).per_gpu
                lines.append(f"{method:6s}  {vocab:5d}  {name:13s} {a.peak_allocated_bytes:15,d}  "
                             f"{t.peak_allocated_bytes:13,d}  {a.peak_allocated_bytes / t.peak_allocated_bytes:15.4f}"
                             f"  {t.peak_phase}")
    text = "\n".join(lines) + "\n"
    OUT.write_text(text, encoding="utf-8")
    print(text, end="")


if __name__ == "__main__":
    main()
