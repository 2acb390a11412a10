"""The scenario's ``lifecycle`` settings as the estimate resolved them, for the exporters.

A null ``lifecycle`` field takes the framework's default (``analytic/lifecycle/``); the exporters write
the resolved value into the library option that sets it, so the run launched from the files is the run
that was estimated.  The defaults are the analytic engine's own (``eval_runs``, ``eval_batch_size``,
``eval_generates``, ``state_dict_type`` in ``analytic/lifecycle/evaluation.py`` and ``save.py``), repeated
here for a ``TrainSetup`` (which has no ``StepContext``) and checked against them by the tests.

Which option each setting becomes (transformers 5.24 ``TrainingArguments``, accelerate 1.15
``FullyShardedDataParallelPlugin``, DeepSpeed 0.19 ``zero_optimization``, trl 1.16 ``SFTConfig``):

* ``evaluation`` -> ``eval_strategy`` ("steps" or "no");
* ``eval_batch_size`` -> ``per_device_eval_batch_size``;
* ``eval_keeps_logits`` -> ``prediction_loss_only`` (the inverse: ``Trainer.evaluation_loop`` keeps no logits
  with it set);
* ``eval_accumulation_steps`` -> ``eval_accumulation_steps``;
* ``checkpoint_save`` -> ``save_strategy`` ("steps" or "no");
* ``save_optimizer`` -> ``save_only_model`` (the inverse);
* ``state_dict_type`` -> FSDP ``state_dict_type`` (``FULL_STATE_DICT``: accelerate's
  ``set_state_dict_type`` then sets ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``, the
  estimate's ``full_offload``; ``SHARDED_STATE_DICT``: ``sharded``), DeepSpeed
  ``stage3_gather_16bit_weights_on_model_save`` (true: the 16-bit save gathers one module at a time,
  ``full_offload``; false: ``save_checkpoint`` writes each rank's partition, ``sharded``);
* ``load_dtype`` -> ``from_pretrained``'s ``dtype``; ``device_map`` -> its ``device_map``.

``eval_batches``, ``eval_generate_tokens`` and a ``full`` state dict without offload have no option: the
launch README states them as assumptions (``readme.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vramplan.analytic.lifecycle.evaluation import HF_EVAL_BATCH
from vramplan.plan.setup import TrainSetup
from vramplan.spec.scenario import Lifecycle

__all__ = ["ResolvedLifecycle", "lifecycle_of", "resolve_lifecycle"]


@dataclass(frozen=True)
class ResolvedLifecycle:
    """Every lifecycle setting with the framework's default filled in (``analytic/lifecycle/``)."""

    evaluation: bool
    eval_batch_size: int
    eval_keeps_logits: bool
    eval_batches: int
    eval_accumulation_steps: int | None
    eval_generate_tokens: int
    checkpoint_save: bool
    state_dict_type: str
    save_optimizer: bool
    load_dtype: str
    device_map: str
    sharded: bool
    """The model is sharded (FSDP, or ZeRO-3) so the state-dict type decides what a save gathers."""


def lifecycle_of(scenario: dict[str, Any]) -> Lifecycle:
    """The ``lifecycle`` section of a scenario mapping (a plan's ``scenario``), validated."""
    return Lifecycle(**(scenario.get("lifecycle") or {}))


def resolve_lifecycle(s: TrainSetup, lc: Lifecycle | None = None) -> ResolvedLifecycle:
    """``lc`` (default: every field null) with the defaults the estimate took for ``s``'s framework."""
    lc = lc or Lifecycle()
    fw = s.framework
    # analytic/lifecycle/evaluation.py eval_runs / eval_batch_size / eval_generates: only Lightning evaluates by
    # default; the HF Trainer's batch is per_device_eval_batch_size=8, the other loops' the training micro-batch
    evaluation = lc.evaluation if lc.evaluation is not None else False
    batch = lc.eval_batch_size if lc.eval_batch_size is not None else (
        HF_EVAL_BATCH if fw == "hf-trainer" else s.micro_batch_size)
    generate = lc.eval_generate_tokens if lc.eval_generate_tokens is not None else 0
    # analytic/lifecycle/save.py state_dict_type: sharded under torchtitan (DCP) and DeepSpeed (save_checkpoint)
    sdt = lc.state_dict_type if lc.state_dict_type is not None else (
        "sharded" if fw in ("torchtitan", "deepspeed") else "full_offload")
    # analytic/lifecycle/load.py host_load_bytes: a bitsandbytes model gets a device map, the others none
    device_map = lc.device_map if lc.device_map is not None else ("auto" if s.quantization != "none" else "none")
    sharded = fw in ("accelerate", "torchtitan") and s.fsdp != "none" or s.zero_stage == 3
    return ResolvedLifecycle(
        evaluation=evaluation, eval_batch_size=batch, eval_keeps_logits=lc.eval_keeps_logits,
        eval_batches=lc.eval_batches, eval_accumulation_steps=lc.eval_accumulation_steps,
        eval_generate_tokens=generate, checkpoint_save=lc.checkpoint_save, state_dict_type=sdt,
        save_optimizer=lc.save_optimizer, load_dtype=lc.load_dtype, device_map=device_map, sharded=sharded)
