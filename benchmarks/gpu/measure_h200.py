"""Run ``vramplan measure`` on a real CUDA GPU for a fixed list of scenarios and keep every result.

Each scenario runs in its own process (``vramplan measure ... --json``), so each has its own CUDA
context, caching allocator and peak counters.  Several run at once when the analytic estimates of
their device memory fit the GPU together (a scheduler over the estimate, times 1.3 for safety), so
the list fits a short lease; every process reads only its own counters
(``torch.cuda.max_memory_allocated``/``max_memory_reserved`` and NVML's per-process used memory),
which other processes do not change.

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=src python3 benchmarks/gpu/measure_h200.py --out OUT_DIR [--only ID ...] [--jobs 4]

Writes ``OUT_DIR/results.jsonl`` (one line per scenario: id, command, return code, seconds, the
measure JSON or the error text) and ``OUT_DIR/env.json`` (torch, transformers, GPU, driver).
``benchmarks/gpu/compare.py`` renders the comparison with both engines.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

GPU = "H200"
CLI = [sys.executable, "-c", "from vramplan.cli.main import main; main()"]

# (id, flags).  Chosen to cover the classes of runs the engines model: full fine-tuning in each
# precision, LoRA with and without checkpointing, large vocabularies (Qwen 152k, Gemma 256k), eager
# attention, sliding windows, MoE, and generate() with long prompts and large batches.
SCENARIOS: list[tuple[str, list[str]]] = [
    ("llama32-1b-full-bf16mixed", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "bf16-mixed",
                                   "--optimizer", "adamw", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("llama32-1b-full-gc-s4096", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "bf16-mixed",
                                  "--optimizer", "adamw", "--gradient-checkpointing", "full", "--micro-batch-size", "4",
                                  "--seq-len", "4096"]),
    ("qwen25-15b-full-bf16mixed", ["--model", "Qwen/Qwen2.5-1.5B", "--task", "train", "--precision", "bf16-mixed",
                                   "--optimizer", "adamw", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("gemma2-2b-full-bf16mixed", ["--model", "google/gemma-2-2b", "--task", "train", "--precision", "bf16-mixed",
                                  "--optimizer", "adamw", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("phi3-mini-full-bf16true-gc", ["--model", "microsoft/Phi-3-mini-4k-instruct", "--task", "train", "--precision",
                                    "bf16-true", "--optimizer", "adamw", "--gradient-checkpointing", "full",
                                    "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("llama31-8b-full-bf16true-gc", ["--model", "meta-llama/Llama-3.1-8B", "--task", "train", "--precision", "bf16-true",
                                     "--optimizer", "adamw-fused", "--gradient-checkpointing", "full",
                                     "--micro-batch-size", "2", "--seq-len", "4096"]),
    ("llama31-8b-lora-r16", ["--model", "meta-llama/Llama-3.1-8B", "--task", "train", "--precision", "bf16-true",
                             "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("llama31-8b-lora-gc-s4096", ["--model", "meta-llama/Llama-3.1-8B", "--task", "train", "--precision", "bf16-true",
                                  "--peft", "lora", "--lora-rank", "16", "--gradient-checkpointing", "full",
                                  "--micro-batch-size", "8", "--seq-len", "4096"]),
    ("mistral7b-lora-r64-all", ["--model", "mistralai/Mistral-7B-v0.3", "--task", "train", "--precision", "bf16-true",
                                "--peft", "lora", "--lora-rank", "64", "--target-modules", "all-linear",
                                "--micro-batch-size", "2", "--seq-len", "4096"]),
    ("qwen25-7b-lora-gc", ["--model", "Qwen/Qwen2.5-7B", "--task", "train", "--precision", "bf16-true", "--peft", "lora",
                           "--lora-rank", "16", "--gradient-checkpointing", "full", "--micro-batch-size", "4",
                           "--seq-len", "4096"]),
    ("olmoe-full-bf16true-gc", ["--model", "allenai/OLMoE-1B-7B-0924", "--task", "train", "--precision", "bf16-true",
                                "--optimizer", "adamw", "--gradient-checkpointing", "full", "--micro-batch-size", "2",
                                "--seq-len", "2048"]),
    ("qwen3-06b-full-fp32", ["--model", "Qwen/Qwen3-0.6B", "--task", "train", "--precision", "fp32", "--optimizer",
                             "adamw", "--micro-batch-size", "4", "--seq-len", "1024"]),
    ("smollm2-360m-fp16mixed", ["--model", "HuggingFaceTB/SmolLM2-360M-Instruct", "--task", "train", "--precision",
                                "fp16-mixed", "--optimizer", "adamw", "--micro-batch-size", "8", "--seq-len", "2048"]),
    ("gpt2-medium-eager", ["--model", "openai-community/gpt2-medium", "--task", "train", "--precision", "bf16-mixed",
                           "--optimizer", "adamw", "--attention", "eager", "--micro-batch-size", "8", "--seq-len",
                           "1024"]),
    ("gemma3-1b-full-s4096", ["--model", "google/gemma-3-1b-pt", "--task", "train", "--precision", "bf16-mixed",
                              "--optimizer", "adamw", "--micro-batch-size", "2", "--seq-len", "4096"]),
    ("llama31-8b-gen-b8", ["--model", "meta-llama/Llama-3.1-8B", "--task", "inference", "--dtype", "bf16",
                           "--batch-size", "8", "--prompt-len", "2048", "--new-tokens", "256"]),
    ("qwen25-7b-gen-b32", ["--model", "Qwen/Qwen2.5-7B", "--task", "inference", "--dtype", "bf16", "--batch-size", "32",
                           "--prompt-len", "1024", "--new-tokens", "128"]),
    ("gemma2-9b-gen-s4096", ["--model", "google/gemma-2-9b", "--task", "inference", "--dtype", "bf16", "--batch-size",
                             "4", "--prompt-len", "4096", "--new-tokens", "128"]),
    ("mistral7b-v01-gen-s8192", ["--model", "mistralai/Mistral-7B-v0.1", "--task", "inference", "--dtype", "bf16",
                                 "--batch-size", "4", "--prompt-len", "8192", "--new-tokens", "64"]),
    ("qwen3-30b-a3b-gen", ["--model", "Qwen/Qwen3-30B-A3B", "--task", "inference", "--dtype", "bf16", "--batch-size",
                           "4", "--prompt-len", "2048", "--new-tokens", "64"]),
    ("llama32-1b-gen-fp32-eager", ["--model", "meta-llama/Llama-3.2-1B", "--task", "inference", "--dtype", "fp32",
                                   "--attention", "eager", "--batch-size", "16", "--prompt-len", "512",
                                   "--new-tokens", "512"]),
    ("phi35-mini-gen-b16", ["--model", "microsoft/Phi-3.5-mini-instruct", "--task", "inference", "--dtype", "bf16",
                            "--batch-size", "16", "--prompt-len", "2048", "--new-tokens", "128"]),
]

# A second list, written after the first run's findings were modelled (commit d7fd1b4) and before it ran:
# scenarios none of those changes was developed on, so that it checks them (``--set check``).
CHECK_SCENARIOS: list[tuple[str, list[str]]] = [
    ("llama32-1b-full-fp32", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "fp32",
                              "--optimizer", "adamw", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("qwen25-05b-full-fp32-gc", ["--model", "Qwen/Qwen2.5-0.5B", "--task", "train", "--precision", "fp32",
                                 "--optimizer", "adamw", "--gradient-checkpointing", "full", "--micro-batch-size",
                                 "8", "--seq-len", "2048"]),
    ("qwen25-15b-gen-fp32", ["--model", "Qwen/Qwen2.5-1.5B", "--task", "inference", "--dtype", "fp32",
                             "--batch-size", "8", "--prompt-len", "2048", "--new-tokens", "32"]),
    ("llama32-3b-gen-fp32-s4096", ["--model", "meta-llama/Llama-3.2-3B", "--task", "inference", "--dtype", "fp32",
                                   "--batch-size", "4", "--prompt-len", "4096", "--new-tokens", "16"]),
    ("llama32-3b-gen-b32", ["--model", "meta-llama/Llama-3.2-3B", "--task", "inference", "--dtype", "bf16",
                            "--batch-size", "32", "--prompt-len", "1024", "--new-tokens", "64"]),
    ("qwen3-8b-gen-b16", ["--model", "Qwen/Qwen3-8B", "--task", "inference", "--dtype", "bf16", "--batch-size", "16",
                          "--prompt-len", "2048", "--new-tokens", "64"]),
    ("mistral7b-v03-gen-s4096", ["--model", "mistralai/Mistral-7B-v0.3", "--task", "inference", "--dtype", "bf16",
                                 "--batch-size", "8", "--prompt-len", "4096", "--new-tokens", "32"]),
    ("gemma2-2b-gen-b8", ["--model", "google/gemma-2-2b", "--task", "inference", "--dtype", "bf16", "--batch-size",
                          "8", "--prompt-len", "2048", "--new-tokens", "64"]),
    ("qwen25-14b-gen-s8192", ["--model", "Qwen/Qwen2.5-14B", "--task", "inference", "--dtype", "bf16",
                              "--batch-size", "4", "--prompt-len", "8192", "--new-tokens", "32"]),
    ("smollm2-17b-gen-b64", ["--model", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "--task", "inference", "--dtype",
                             "bf16", "--batch-size", "64", "--prompt-len", "512", "--new-tokens", "128"]),
    ("qwen25-3b-lora-gc-s4096", ["--model", "Qwen/Qwen2.5-3B", "--task", "train", "--precision", "bf16-true",
                                 "--peft", "lora", "--lora-rank", "16", "--gradient-checkpointing", "full",
                                 "--micro-batch-size", "8", "--seq-len", "4096"]),
    ("llama32-3b-full-fused", ["--model", "meta-llama/Llama-3.2-3B", "--task", "train", "--precision", "bf16-mixed",
                               "--optimizer", "adamw-fused", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("phi35-lora-all-s4096", ["--model", "microsoft/Phi-3.5-mini-instruct", "--task", "train", "--precision",
                              "bf16-true", "--peft", "lora", "--lora-rank", "32", "--target-modules", "all-linear",
                              "--micro-batch-size", "4", "--seq-len", "4096"]),
]

# A third list (``--set check2``), written at commit 8319104 before it ran: the 9-byte math prefill, the replay
# past 256 decode steps and the late-growth statement, on scenarios no change was developed on.
CHECK2_SCENARIOS: list[tuple[str, list[str]]] = [
    ("qwen3-17b-gen-fp32-s4096", ["--model", "Qwen/Qwen3-1.7B", "--task", "inference", "--dtype", "fp32",
                                  "--batch-size", "4", "--prompt-len", "4096", "--new-tokens", "8"]),
    ("qwen25-05b-full-fp32", ["--model", "Qwen/Qwen2.5-0.5B", "--task", "train", "--precision", "fp32",
                              "--optimizer", "adamw", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("smollm2-360m-gen-b128", ["--model", "HuggingFaceTB/SmolLM2-360M-Instruct", "--task", "inference", "--dtype",
                               "bf16", "--batch-size", "128", "--prompt-len", "256", "--new-tokens", "128"]),
    ("llama32-1b-gen-b64", ["--model", "meta-llama/Llama-3.2-1B", "--task", "inference", "--dtype", "bf16",
                            "--batch-size", "64", "--prompt-len", "512", "--new-tokens", "128"]),
    ("llama32-1b-gen-b16-n512", ["--model", "meta-llama/Llama-3.2-1B", "--task", "inference", "--dtype", "bf16",
                                 "--batch-size", "16", "--prompt-len", "1024", "--new-tokens", "512"]),
    ("qwen25-7b-gen-b4-s16k", ["--model", "Qwen/Qwen2.5-7B", "--task", "inference", "--dtype", "bf16",
                               "--batch-size", "4", "--prompt-len", "16384", "--new-tokens", "32"]),
]

# A fourth list (``--set h100``), written at commit e0dddd5 (with PEFT's default LoRA targets, facts/peft_targets.py) before
# it ran, for the first lent H100: beam search
# (``inference.num_beams``: its expanded KV cache and per-beam log-probabilities), families not measured before
# (GPT-NeoX, Falcon's fused query_key_value, Phi-2, SmolLM3's NoPE layers, OLMo 2, OPT, GPT-2 large, a granite
# MoE), DoRA, gradient accumulation, SGD with momentum and Adafactor, Gemma 2 LoRA (the unexplained +16% reserved of
# its full fine-tune) and a 16k prompt.  Nothing in the engines was changed for these scenarios.
H100_SCENARIOS: list[tuple[str, list[str]]] = [
    ("llama32-1b-gen-beam4", ["--model", "meta-llama/Llama-3.2-1B", "--task", "inference", "--dtype", "bf16",
                              "--batch-size", "4", "--prompt-len", "1024", "--new-tokens", "64", "--num-beams", "4"]),
    ("qwen25-15b-gen-beam8", ["--model", "Qwen/Qwen2.5-1.5B", "--task", "inference", "--dtype", "bf16",
                              "--batch-size", "2", "--prompt-len", "512", "--new-tokens", "64", "--num-beams", "8"]),
    ("pythia-14b-full-bf16mixed", ["--model", "EleutherAI/pythia-1.4b", "--task", "train", "--precision",
                                   "bf16-mixed", "--optimizer", "adamw", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("falcon7b-lora-r16", ["--model", "tiiuae/falcon-7b", "--task", "train", "--precision", "bf16-true", "--peft",
                           "lora", "--lora-rank", "16", "--target-modules", "query_key_value", "--micro-batch-size", "1", "--seq-len", "1024"]),
    ("phi2-lora-fp16mixed", ["--model", "microsoft/phi-2", "--task", "train", "--precision", "fp16-mixed",
                                "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "2",
                                "--seq-len", "2048"]),
    ("qwen3-4b-lora-gc-ga4", ["--model", "Qwen/Qwen3-4B", "--task", "train", "--precision", "bf16-true", "--peft",
                              "lora", "--lora-rank", "16", "--gradient-checkpointing", "full", "--micro-batch-size",
                              "2", "--seq-len", "4096", "--grad-accum-steps", "4"]),
    ("llama32-1b-dora-r16", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "bf16-true",
                             "--peft", "dora", "--lora-rank", "16", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("gemma2-2b-lora-r16", ["--model", "google/gemma-2-2b", "--task", "train", "--precision", "bf16-true", "--peft",
                            "lora", "--lora-rank", "16", "--micro-batch-size", "1", "--seq-len", "2048"]),
    ("smollm3-3b-lora-gc-s4096", ["--model", "HuggingFaceTB/SmolLM3-3B-Base", "--task", "train", "--precision",
                                  "bf16-true", "--peft", "lora", "--lora-rank", "16", "--gradient-checkpointing", "full",
                                  "--micro-batch-size", "4", "--seq-len", "4096"]),
    ("olmo2-7b-gen-b8", ["--model", "allenai/OLMo-2-1124-7B", "--task", "inference", "--dtype", "bf16",
                          "--batch-size", "8", "--prompt-len", "2048", "--new-tokens", "64"]),
    ("opt-67b-gen-fp16", ["--model", "facebook/opt-6.7b", "--task", "inference", "--dtype", "fp16", "--batch-size",
                          "8", "--prompt-len", "1024", "--new-tokens", "128"]),
    ("qwen3-06b-sgdm-bf16true", ["--model", "Qwen/Qwen3-0.6B", "--task", "train", "--precision", "bf16-true",
                                 "--optimizer", "sgd-momentum", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("llama32-3b-adafactor", ["--model", "meta-llama/Llama-3.2-3B", "--task", "train", "--precision", "bf16-true",
                              "--optimizer", "adafactor", "--micro-batch-size", "1", "--seq-len", "2048"]),
    ("granite-moe-lora", ["--model", "ibm-granite/granite-3.1-3b-a800m-instruct", "--task", "train", "--precision",
                          "bf16-true", "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "2", "--seq-len",
                          "2048"]),
    ("nemo-12b-gen-s16k", ["--model", "mistralai/Mistral-Nemo-Base-2407", "--task", "inference", "--dtype", "bf16",
                           "--batch-size", "1", "--prompt-len", "16384", "--new-tokens", "16"]),
    ("gpt2-large-full-fp32-eager", ["--model", "openai-community/gpt2-large", "--task", "train", "--precision",
                                    "fp32", "--optimizer", "adamw", "--attention", "eager", "--micro-batch-size", "1",
                                    "--seq-len", "1024"]),
]

SAFETY = 1.3


# An eighth list (``--set h100e``), written before it ran, with nothing changed in the engines for it: Liger-Kernel's
# fused linear cross-entropy and its RMSNorm/SwiGLU/RoPE kernels (liger-kernel 0.8.2 carried as a wheel; measure
# patches the model instance as TRL's use_liger_kernel does), torchao's 8-bit, 4-bit and fp8 AdamW (torchao 0.14.1
# carried), and the state-space families' generate on transformers 5.17's torch path: Falcon-Mamba (Mamba-1),
# Mamba-Codestral (Mamba2, the broadcast scan of releases before 5.18) and a synthetic Jamba
# (``benchmarks/gpu/configs/jamba-synthetic-3b.json``, not a released checkpoint).
H100E_SCENARIOS: list[tuple[str, list[str]]] = [
    ("llama32-1b-liger-flce-s4096", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "bf16-mixed", "--optimizer", "adamw", "--micro-batch-size", "4", "--seq-len", "4096", "--loss", "liger-fused-linear-ce"]),
    ("qwen25-15b-liger-all-s4096", ["--model", "Qwen/Qwen2.5-1.5B", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw", "--micro-batch-size", "4", "--seq-len", "4096", "--loss", "liger-fused-linear-ce", "--liger-kernels"]),
    ("llama31-8b-lora-gc-liger-flce", ["--model", "meta-llama/Llama-3.1-8B", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--gradient-checkpointing", "full", "--micro-batch-size", "8", "--seq-len", "4096", "--loss", "liger-fused-linear-ce"]),
    ("qwen3-4b-lora-liger-kernels", ["--model", "Qwen/Qwen3-4B", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "4", "--seq-len", "2048", "--liger-kernels"]),
    ("mistral7b-lora-liger-all", ["--model", "mistralai/Mistral-7B-v0.3", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "2", "--seq-len", "4096", "--liger-kernels", "--loss", "liger-fused-linear-ce"]),
    ("qwen25-15b-torchao-adamw8bit", ["--model", "Qwen/Qwen2.5-1.5B", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw-8bit-torchao", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("llama32-1b-torchao-adamw4bit", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "bf16-mixed", "--optimizer", "adamw-4bit", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("qwen3-06b-torchao-adamwfp8", ["--model", "Qwen/Qwen3-0.6B", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw-fp8", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("falcon-mamba-7b-gen-b4-tf517", ["--model", "tiiuae/falcon-mamba-7b", "--task", "inference", "--dtype", "bf16", "--batch-size", "4", "--prompt-len", "2048", "--new-tokens", "32", "--transformers-version", "5.17"]),
    ("mamba-codestral-gen-b2-tf517", ["--model", "mistralai/Mamba-Codestral-7B-v0.1", "--task", "inference", "--dtype", "bf16", "--batch-size", "2", "--prompt-len", "1024", "--new-tokens", "32", "--transformers-version", "5.17"]),
    ("jamba-synth-gen-b4-tf517", ["--model", "benchmarks/gpu/configs/jamba-synthetic-3b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "4", "--prompt-len", "2048", "--new-tokens", "32", "--transformers-version", "5.17"]),
]

# A tenth list (``--set h100f``), written at the commit that added it, before it ran, with nothing changed in the engines
# for it: families added since ``h100e`` and never measured on a GPU (LFM2's short convolutions, MiniMax's lightning
# attention with its own cache class, Qwen3-Next's gated DeltaNet on transformers' torch fallback, RecurrentGemma's
# RG-LRU, Gemma 3n's AltUp text model, Zamba2's shared blocks on the 5.17 Mamba2 scan), LFM2 and Qwen3-Next training,
# and ``h100e``'s unrun Falcon-Mamba.  The configs are synthetic (``configs/*-synthetic-*.json``: transformers 5.24's
# config classes, shrunk where named) except Gemma 3n's, the catalog row's ``text_config``.
_F = "benchmarks/gpu/configs/"
_TF517 = ["--transformers-version", "5.17"]
H100F_SCENARIOS: list[tuple[str, list[str]]] = [
    ("lfm2-synth-gen-b8-p4096", ["--model", _F + "lfm2-synthetic-1b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "8", "--prompt-len", "4096", "--new-tokens", "64", *_TF517]),
    ("lfm2-synth-full-bf16true", ["--model", _F + "lfm2-synthetic-1b.json", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw", "--micro-batch-size", "4", "--seq-len", "2048", *_TF517]),
    ("minimax-synth-gen-b8-p4096", ["--model", _F + "minimax-synthetic-2b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "8", "--prompt-len", "4096", "--new-tokens", "32", *_TF517]),
    ("qwen3next-synth-gen-b4-p4096", ["--model", _F + "qwen3next-synthetic-3b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "4", "--prompt-len", "4096", "--new-tokens", "32", *_TF517]),
    ("qwen3next-synth-full-bf16true", ["--model", _F + "qwen3next-synthetic-3b.json", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw", "--micro-batch-size", "2", "--seq-len", "2048", *_TF517]),
    ("recurrentgemma-synth-gen-b8", ["--model", _F + "recurrentgemma-synthetic-2b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "8", "--prompt-len", "2048", "--new-tokens", "64", *_TF517]),
    ("gemma3n-e4b-text-gen-b4", ["--model", _F + "gemma3n-e4b-text.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "4", "--prompt-len", "2048", "--new-tokens", "32", *_TF517]),
    ("zamba2-synth-gen-b2-p1024-tf517", ["--model", _F + "zamba2-synthetic-2b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "2", "--prompt-len", "1024", "--new-tokens", "32", *_TF517]),
    *[(sid, flags) for sid, flags in H100E_SCENARIOS if sid == "falcon-mamba-7b-gen-b4-tf517"],
]


# A fifth list (``--set h100b``), written after the h100 run and before it ran, with nothing changed in the engines:
# bitsandbytes' 8-bit and paged 8-bit AdamW (bitsandbytes 0.50.2 carried as a wheel), long-context LoRA, LoRA on
# every linear, MLA (DeepSeek-V2-Lite) and Gemma 3's sliding layers at generate, beam search with a sliding window,
# fp16 mixed precision with fused AdamW and fp32 training.
H100B_SCENARIOS: list[tuple[str, list[str]]] = [
    ("llama32-1b-full-adamw8bit", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "bf16-mixed", "--optimizer", "adamw-8bit", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("qwen25-15b-paged8bit-bf16true", ["--model", "Qwen/Qwen2.5-1.5B", "--task", "train", "--precision", "bf16-true", "--optimizer", "paged-adamw-8bit", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("mistral7b-lora-gc-s8192", ["--model", "mistralai/Mistral-7B-v0.3", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--gradient-checkpointing", "full", "--micro-batch-size", "1", "--seq-len", "8192"]),
    ("qwen3-8b-lora-r64-all-gc", ["--model", "Qwen/Qwen3-8B", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "64", "--target-modules", "all-linear", "--gradient-checkpointing", "full", "--micro-batch-size", "2", "--seq-len", "4096"]),
    ("dsv2-lite-gen-b4", ["--model", "deepseek-ai/DeepSeek-V2-Lite", "--task", "inference", "--dtype", "bf16", "--batch-size", "4", "--prompt-len", "2048", "--new-tokens", "32"]),
    ("olmoe-lora-r16", ["--model", "allenai/OLMoE-1B-7B-0924", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("phi4-mini-lora-all", ["--model", "microsoft/Phi-4-mini-instruct", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--target-modules", "all-linear", "--micro-batch-size", "1", "--seq-len", "4096"]),
    ("gemma3-1b-gen-b32", ["--model", "google/gemma-3-1b-pt", "--task", "inference", "--dtype", "bf16", "--batch-size", "32", "--prompt-len", "1024", "--new-tokens", "128"]),
    ("mistral7b-v01-gen-beam4", ["--model", "mistralai/Mistral-7B-v0.1", "--task", "inference", "--dtype", "bf16", "--batch-size", "2", "--prompt-len", "2048", "--new-tokens", "64", "--num-beams", "4"]),
    ("smollm2-17b-full-fp16mixed", ["--model", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "--task", "train", "--precision", "fp16-mixed", "--optimizer", "adamw-fused", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("tinyllama-full-fp32", ["--model", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "--task", "train", "--precision", "fp32", "--optimizer", "adamw", "--micro-batch-size", "1", "--seq-len", "2048"]),
    ("llama31-8b-gen-s32k", ["--model", "meta-llama/Llama-3.1-8B", "--task", "inference", "--dtype", "bf16", "--batch-size", "1", "--prompt-len", "32768", "--new-tokens", "8"]),
]


# A sixth list (``--set h100c``), written at commit 273243a before it ran, with nothing changed in the engines for it:
# mechanisms added since the first runs and never measured on a GPU (Gemma's fp32 norm weight ``1 + w.float()``,
# Cohere's ``weight.to(float32)`` norm copies, Falcon's multi-query K/V at micro-batch 2 where ``matmul`` copies the
# one K/V head to every query head, Bamba's Mamba2 mixer on transformers' torch path, DeepSeek-V2's MLA in training,
# with LoRA on its attention), two optimizers from packages (schedule-free AdamW, CAME: carried as wheels), and the four
# scenarios of ``h100b`` that its deadline left unrun.  The Bamba model is a synthetic config
# (``benchmarks/gpu/configs/bamba-synthetic-2b.json``), not a released checkpoint.
H100C_SCENARIOS: list[tuple[str, list[str]]] = [
    ("gemma-2b-full-bf16true", ["--model", "google/gemma-2b", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("gemma-7b-lora-r16", ["--model", "google/gemma-7b", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "1", "--seq-len", "2048"]),
    ("aya23-8b-lora-r16", ["--model", "CohereForAI/aya-23-8B", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("command-r7b-lora-gc-s4096", ["--model", "CohereForAI/c4ai-command-r7b-12-2024", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--gradient-checkpointing", "full", "--micro-batch-size", "2", "--seq-len", "4096"]),
    ("falcon7b-lora-b2", ["--model", "tiiuae/falcon-7b", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--target-modules", "query_key_value", "--micro-batch-size", "2", "--seq-len", "1024"]),
    ("llama32-1b-schedulefree", ["--model", "meta-llama/Llama-3.2-1B", "--task", "train", "--precision", "bf16-mixed", "--optimizer", "schedule-free-adamw", "--micro-batch-size", "4", "--seq-len", "2048"]),
    ("qwen25-15b-came-bf16true", ["--model", "Qwen/Qwen2.5-1.5B", "--task", "train", "--precision", "bf16-true", "--optimizer", "came", "--micro-batch-size", "2", "--seq-len", "2048"]),
    ("bamba-synth-full-bf16true", ["--model", "benchmarks/gpu/configs/bamba-synthetic-2b.json", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw", "--micro-batch-size", "1", "--seq-len", "2048"]),
    ("bamba-synth-gen-b8", ["--model", "benchmarks/gpu/configs/bamba-synthetic-2b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "8", "--prompt-len", "2048", "--new-tokens", "64"]),
    ("dsv2-lite-lora-r16", ["--model", "deepseek-ai/DeepSeek-V2-Lite", "--task", "train", "--precision", "bf16-true", "--peft", "lora", "--lora-rank", "16", "--target-modules", "q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj", "--micro-batch-size", "2", "--seq-len", "2048"]),
    *[(sid, flags) for sid, flags in H100B_SCENARIOS if sid in ("llama31-8b-gen-s32k", "mistral7b-lora-gc-s8192", "mistral7b-v01-gen-beam4", "gemma3-1b-gen-b32")],
]


# A seventh list (``--set h100d``), written after ``h100c``'s two Bamba scenarios ran out of memory (transformers 5.17's
# torch Mamba2 scan materializes its broadcast products; facts/state_space.py) and after that was modelled, before it
# ran: the 5.17 path at sizes the engine says fit (``software.transformers`` 5.17 given, as the device runs it), and
# ``h100c``'s two Bamba scenarios again under transformers 5.24 (carried as a wheel), the release whose einsum scan
# the engine models when ``software.transformers`` is unset.
H100D_SCENARIOS: list[tuple[str, list[str]]] = [
    ("bamba-synth-gen-b2-p1024-tf517", ["--model", "benchmarks/gpu/configs/bamba-synthetic-2b.json", "--task", "inference", "--dtype", "bf16", "--batch-size", "2", "--prompt-len", "1024", "--new-tokens", "32", "--transformers-version", "5.17"]),
    ("bamba-synth-full-s1024-tf517", ["--model", "benchmarks/gpu/configs/bamba-synthetic-2b.json", "--task", "train", "--precision", "bf16-true", "--optimizer", "adamw", "--micro-batch-size", "1", "--seq-len", "1024", "--transformers-version", "5.17"]),
]
H100D_TF524_SCENARIOS: list[tuple[str, list[str]]] = [
    (sid + "-tf524", flags) for sid, flags in H100C_SCENARIOS if sid.startswith("bamba-")
]


def _estimate_bytes(flags: list[str], gpu: str = GPU) -> int:
    """The analytic estimate of the process's device memory (nvidia-smi), for scheduling only."""
    p = subprocess.run([*CLI, "estimate", *flags, "--gpu", gpu, "--json"], check=False, capture_output=True, text=True, timeout=120)
    try:
        doc = json.loads(p.stdout)
        return int(doc["per_gpu"]["device_used_bytes"])
    except (ValueError, KeyError, TypeError):
        return 40 * 2**30


def _env() -> dict[str, object]:
    out: dict[str, object] = {"python": sys.version}
    try:
        import torch
        import transformers

        out.update(torch=torch.__version__, cuda=torch.version.cuda, transformers=transformers.__version__,
                   gpu=torch.cuda.get_device_name(0), capacity_bytes=torch.cuda.get_device_properties(0).total_memory)
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal
        out["torch_error"] = repr(exc)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True)
        out["nvidia_smi"] = smi.stdout.strip()
    except OSError as exc:
        out["nvidia_smi"] = repr(exc)
    try:
        import peft

        out["peft"] = peft.__version__
    except ImportError:
        out["peft"] = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--set", choices=("first", "check", "check2", "h100", "h100b", "h100c", "h100d", "h100d-tf524", "h100e", "h100f"), default="first", help="which scenario list")
    ap.add_argument("--gpu", default=GPU, help="catalog GPU the scheduler estimates with (H200, H100)")
    ap.add_argument("--capacity-gib", type=float, default=139.0, help="what the running estimates may add up to")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--device", default="cuda", help="cuda; cpu only to try this script on a small --extra shrink")
    ap.add_argument("--extra", default="", help="flags added to every measure command (e.g. a shrink for a try)")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which no new scenario starts")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "env.json").write_text(json.dumps(_env(), indent=1))
    chosen = {"first": SCENARIOS, "check": CHECK_SCENARIOS, "check2": CHECK2_SCENARIOS, "h100": H100_SCENARIOS,
              "h100b": H100B_SCENARIOS, "h100c": H100C_SCENARIOS, "h100d": H100D_SCENARIOS, "h100d-tf524": H100D_TF524_SCENARIOS,
              "h100e": H100E_SCENARIOS, "h100f": H100F_SCENARIOS}[args.set]
    todo = [(sid, flags) for sid, flags in chosen if not args.only or sid in args.only]
    sized = [(sid, flags, _estimate_bytes(flags, args.gpu)) for sid, flags in todo]
    capacity_bytes = int(args.capacity_gib * 2**30)
    sized.sort(key=lambda t: -t[2])  # large first: they run alone or with the small ones
    running: list[tuple[str, list[str], int, subprocess.Popen[str], float]] = []
    results = (args.out / "results.jsonl").open("a")
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")

    def reap(block: bool) -> None:
        while True:
            for item in list(running):
                sid, flags, est, proc, t0 = item
                rc = proc.poll()
                if rc is None and time.time() - t0 > args.timeout:
                    proc.kill()
                    rc = proc.wait()
                if rc is None:
                    continue
                out, err = proc.communicate()
                try:
                    doc: object = json.loads(out)
                except ValueError:
                    doc = None
                results.write(json.dumps({"id": sid, "flags": flags, "rc": rc, "seconds": round(time.time() - t0, 1),
                                          "estimate_device_used_bytes": est, "result": doc,
                                          "stderr_tail": err[-3000:], "stdout_tail": "" if doc else out[-2000:]}) + "\n")
                results.flush()
                print(f"{sid}: rc={rc} {time.time() - t0:.0f}s", flush=True)
                running.remove(item)
            if not block or not running:
                return
            time.sleep(0.5)

    t_start = time.time()
    for sid, flags, est in sized:
        if time.time() - t_start > args.deadline:
            print(f"skip {sid}: past the deadline", flush=True)
            continue
        while running and (len(running) >= args.jobs
                           or SAFETY * (est + sum(r[2] for r in running)) > capacity_bytes):
            reap(block=False)
            time.sleep(0.5)
        cmd = [*CLI, "measure", *flags, *args.extra.split(), "--gpu", args.gpu, "--device", args.device, "--json"]
        running.append((sid, flags, est, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                          text=True, env=env), time.time()))
        print(f"start {sid} (estimate {est / 2**30:.1f} GiB)", flush=True)
    reap(block=True)
    results.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
