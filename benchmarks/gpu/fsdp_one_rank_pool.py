"""GPU check of torch FSDP's gradient pool on one rank (analytic/terms/sharding.py ``grads_on_reduce_stream``).

The analytic engine replays the final gradients of a torch FSDP job as an allocator pool of their own (the caching
allocator never gives a block of one CUDA stream to another): FSDP2's ``foreach_reduce`` makes ``reduce_output`` under
the reduce-scatter stream even on one rank, and FSDP1's ``_cast_grad_to_param_dtype`` makes the fp32 ``.grad`` on the
post-backward stream under mixed precision.  On one GPU this adds the gradients' own segments to the reserved bytes
(Llama 3.2 1B, bf16-mixed, micro-batch 4 x 2,048: 39.69 -> 44.59 GiB reserved, the half-precision reduce outputs of accelerate's FSDP included).  No measurement backs it yet: this
script is the measurement, for a session that holds a GPU.

Each case builds a Llama-architecture model with random weights in fp32 on the GPU (``hidden`` x ``layers``, the
vocabulary of Llama 3), wraps it as the framework does, and runs three steps of fused AdamW under bf16 autocast
(loss: the mean of the logits' cross-entropy against random labels), ``zero_grad(set_to_none=True)`` after each:

* ``fsdp2``: ``fully_shard`` on every decoder layer and on the root with ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=bf16)`` -- accelerate's FSDP2 under ``mixed_precision: bf16`` (framework ``accelerate``);
* ``fsdp1``: ``FullyShardedDataParallel`` with a transformer-layer auto wrap policy and ``MixedPrecision(bf16, bf16,
  bf16)``, NO_SHARD (FSDP1 clamps one rank to it) -- the HF Trainer's FSDP1 (framework ``hf-trainer``);
* ``plain``: the same model without FSDP (the control: one pool).

It prints one JSON line per case (torch's ``max_memory_allocated`` and ``max_memory_reserved``, and the analytic
engine's prediction of the same scenario with this checkout, both reserved models) and writes them to
``$OUT/fsdp_one_rank_pool.jsonl``.  Run from the repository root on the GPU machine::

    PYTHONPATH=src python benchmarks/gpu/fsdp_one_rank_pool.py --out $OUT           # Llama 3.2 1B's shape
    PYTHONPATH=src python benchmarks/gpu/fsdp_one_rank_pool.py --small --out /tmp   # CPU smoke run (gloo)

What would refute the pool: under ``fsdp2`` / ``fsdp1``, measured reserved close to the ``plain`` case's plus the
allocated difference (the gradients reusing activation segments), where the engine predicts about the gradients'
bytes more.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STEPS = 3


def _model(hidden: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab, tie_word_embeddings=True,
                      max_position_embeddings=8192, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg)


def _wrap(model: Any, how: str, dev: torch.device) -> Any:
    if how == "plain":
        return model
    if how == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        for layer in model.model.layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        return model
    import functools

    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    mp1 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
    return FullyShardedDataParallel(model, auto_wrap_policy=policy, mixed_precision=mp1,
                                    sharding_strategy=ShardingStrategy.NO_SHARD,
                                    device_id=dev if dev.type == "cuda" else None, use_orig_params=True)


def measure(how: str, dims: dict[str, int], batch: int, seq: int, dev: torch.device) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _model(**dims).to(dev)
    model = _wrap(model, how, dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=dev.type == "cuda")
    ids = torch.randint(0, dims["vocab"], (batch, seq), device=dev)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for _ in range(STEPS):
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
        loss.backward()
        del logits, loss
        opt.step()
        opt.zero_grad(set_to_none=True)
    out: dict[str, Any] = {"case": how, "batch": batch, "seq": seq, **dims, "torch": torch.__version__}
    if cuda:
        torch.cuda.synchronize()
        out.update(device=torch.cuda.get_device_name(), max_memory_allocated=torch.cuda.max_memory_allocated(),
                   max_memory_reserved=torch.cuda.max_memory_reserved())
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return out


def predicted(how: str, dims: dict[str, int], batch: int, seq: int, gpu: str) -> dict[str, Any]:
    """The analytic engine's figures for the case's scenario (the shape given as a config.json)."""
    from vramplan.catalog.resolve import resolve
    from vramplan.engine import estimate

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": dims["hidden"],
              "num_hidden_layers": dims["layers"], "num_attention_heads": dims["heads"],
              "num_key_value_heads": dims["kv"], "intermediate_size": dims["inter"], "vocab_size": dims["vocab"],
              "tie_word_embeddings": True, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
              "hidden_act": "silu", "torch_dtype": "float32"}
    fw = {"plain": "hf-trainer", "fsdp2": "accelerate", "fsdp1": "hf-trainer"}[how]
    doc = {"model": config, "task": "train", "framework": fw, "hardware": {"gpu": gpu, "num_gpus": 1},
           "train": {"micro_batch_size": batch, "seq_len": seq, "precision": "bf16-mixed", "optimizer": "adamw-fused",
                     "gradient_checkpointing": "none", "attention": "sdpa"},
           "parallel": {"fsdp": "none" if how == "plain" else ("full_shard" if how == "fsdp2" else "no_shard")},
           "lifecycle": {"checkpoint_save": False}, "offline": True}
    r = resolve(doc)
    rep = estimate(r)
    packed = estimate(r, reserved="packed")
    return {"predicted_allocated": rep.per_gpu.peak_allocated_bytes,
            "predicted_reserved": rep.per_gpu.peak_reserved_bytes,
            "predicted_reserved_packed": packed.per_gpu.peak_reserved_bytes,
            "pool": any("reduce-scatter stream" in a for a in rep.assumptions)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--small", action="store_true", help="a tiny shape for a CPU smoke run")
    ap.add_argument("--gpu", default="H100-SXM", help="the catalog GPU the prediction uses")
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=0, world_size=1)
    if args.small:
        dims = {"hidden": 64, "layers": 2, "heads": 4, "kv": 2, "inter": 128, "vocab": 512}
        batch, seq = 2, 32
    else:  # Llama 3.2 1B's shape (meta-llama/Llama-3.2-1B config.json)
        dims = {"hidden": 2048, "layers": 16, "heads": 32, "kv": 8, "inter": 8192, "vocab": 128256}
        batch, seq = 4, 2048
    path = Path(args.out) / "fsdp_one_rank_pool.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for how in ("plain", "fsdp2", "fsdp1"):
            t0 = time.perf_counter()
            try:
                row = {**measure(how, dims, batch, seq, dev), **predicted(how, dims, batch, seq, args.gpu)}
            except (RuntimeError, ValueError, TypeError, AssertionError) as exc:  # keep the other cases' results
                row = {"case": how, "error": f"{type(exc).__name__}: {exc}"}
            row["seconds"] = round(time.perf_counter() - t0, 2)
            line = json.dumps(row)
            print(line, flush=True)
            fh.write(line + "\n")
    dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
