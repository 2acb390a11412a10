"""Lifecycle phases against published measurements taken inside one phase.

These figures are not the job's maximum, so they are not rows of validation/published.yaml (whose
quantities are maxima over the whole process): each is compared with the phase it was measured in.
The evaluation phase's published row is there (hf-issue-25313-pythia69b-eval-logits-8xa100-80gb-oom).
"""

from __future__ import annotations

from typing import Any

import pytest

from vramplan import estimate
from vramplan.units import GiB, MiB


def _rows(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    return estimate(doc).per_gpu.lifecycle


@pytest.mark.parametrize(("quant", "load_err", "prep_err"), [("nf4-dq", 0.01, 0.05), ("nf4", 0.07, 0.10)])
def test_qlora_load_and_kbit_preparation_reserved(quant: str, load_err: float, prep_err: float) -> None:
    """huggingface/peft PR #3293, comment of 2026-06-25 (the reporter of issue #3265): Mistral-7B-v0.3 NF4 on a
    Jetson Orin Nano Super 8GB, torch 2.5.0a0, peft 0.18.0, bitsandbytes 0.46.1, ``torch.cuda.memory_reserved()
    // (1024 * 1024)`` after each phase: 'Phase 05 (NF4 model loaded) ... reserved ... 4210 MB',
    'Phase 06 (prepare_model_for_kbit_training returned) ... 5030 MB', 'reserved_peak 5030 MB' (MB = MiB
    by the formula).  Double quantization is not stated: both formats are checked.  The phases do not depend
    on the GPU (no workspace or context inside the allocator), so any catalog GPU serves.

    Predicted (MiB): nf4-dq load 4,228 (+0.4%), preparation 5,252 (+4.4%); nf4 4,470 (+6.2%), 5,494 (+9.2%).
    Before the lifecycle the estimate had no figure for either phase (the step's resident parameters only)."""
    rows = _rows({"model": "mistralai/Mistral-7B-v0.3", "hardware": {"gpu": "A100-80GB"},
                  "train": {"seq_len": 512, "peft": {"method": "qlora"}, "quantization": quant}})
    load, prep = rows["load"]["reserved_bytes"], rows["peft preparation"]["reserved_bytes"]
    assert abs(load / (4210 * MiB) - 1) < load_err
    assert abs(prep / (5030 * MiB) - 1) < prep_err
    # preparation adds cached blocks: the half originals of the embedding, norms and head (+820 MiB measured)
    assert prep > load


def test_fsdp_full_state_dict_save_allocated() -> None:
    """tatsu-lab/stanford_alpaca issue #65 ('OOM after the last epoch', 2023-03-16): train.py of that day
    (LLaMA-7B, Trainer with --fsdp "full_shard auto_wrap", --bf16, per_device_train_batch_size 4,
    gradient_accumulation_steps 8, model_max_length 512) on A100-40GB, whose ``safe_save_model_for_hf_trainer``
    calls ``trainer.model.state_dict()`` under FSDP's default FULL_STATE_DICT (no offload_to_cpu, no
    rank0_only): 'Failed to clone() tensor with name lm_head.weight ... CUDA out of memory. Tried to allocate
    502.00 MiB (GPU 1; 39.59 GiB total capacity; 35.54 GiB already allocated; 276.19 MiB free; 37.22 GiB
    reserved in total by PyTorch)'.  The head is the last tensor cloned: 35.54 GiB + its fp32 clone (32,001 x
    4,096 x 4 B = 500.02 MiB, asked as 502 MiB after rounding) = 36.03 GiB is the save's allocated peak.  The
    GPU count is not stated; 8 is assumed (on 4 the training step itself would need ~45 GiB, and the issue
    says training finished).  LLaMA-7B has Llama-2-7B's shapes (the pad token's extra row aside).  The save
    holds the model only (``save_optimizer: False``): the README's ``--save_steps 2000`` is never reached in
    3 epochs of 52,002 samples at 256 per step (610 steps), so no Trainer checkpoint with the optimizer ran.

    Predicted: 36.0 GiB (-0.1%); the steady step alone 32.05 GiB (-11%), which is what the estimate said before.
    The run still ran out of memory where the estimate says the job fits in 39.59 GiB: the save's clones
    could not reuse the step's cached blocks (reserved 37.22 GiB for 35.54 allocated) and 2.1 GiB lay outside
    PyTorch's allocator, neither of which the phase model counts (docs/lifecycle.md)."""
    # transformers of that day: the repository pinned a commit of the LLaMA pull request (4.28.0.dev0)
    doc = {"model": "meta-llama/Llama-2-7b-hf", "hardware": {"gpu": "A100-40GB", "num_gpus": 8}, "framework": "hf-trainer",
           "software": {"transformers": "4.28"},
           "train": {"micro_batch_size": 4, "seq_len": 512, "grad_accum_steps": 8, "precision": "bf16-mixed",
                     "attention": "eager"},
           "parallel": {"fsdp": "full_shard"}, "lifecycle": {"state_dict_type": "full", "save_optimizer": False}}
    rows = _rows(doc)
    measured = 35.54 * GiB + 502 * MiB
    assert abs(rows["checkpoint save"]["allocated_bytes"] / measured - 1) < 0.02
    assert rows["training step"]["allocated_bytes"] < 0.9 * measured
