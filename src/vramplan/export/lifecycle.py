"""The scenario's ``lifecycle`` settings as the estimate resolved them, for the exporters.

A null ``lifecycle`` field takes the framework's default (``analytic/lifecycle/``); the exporters write
the resolved value into the library option that sets it, so the run launched from the files is the run
that was estimated.  The defaults are the analytic engine's own: the same ``*_for`` functions of ``analytic/lifecycle/``
(``evaluation.py``, ``save.py``, ``load.py``) that the estimate reads, given the settings of a ``TrainSetup``.

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

from vramplan.analytic.lifecycle.evaluation import eval_batch_size_for, eval_generates_for, eval_runs_for
from vramplan.analytic.lifecycle.load import device_map_for
from vramplan.analytic.lifecycle.save import state_dict_type_for
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
    eval_seq_len: int | None = None
    """Tokens per evaluation sequence when the scenario names them (None: the training length)."""


def lifecycle_of(scenario: dict[str, Any]) -> Lifecycle:
    """The ``lifecycle`` section of a scenario mapping (a plan's ``scenario``), validated."""
    return Lifecycle(**(scenario.get("lifecycle") or {}))


def resolve_lifecycle(s: TrainSetup, lc: Lifecycle | None = None) -> ResolvedLifecycle:
    """``lc`` (default: every field null) with the defaults the estimate took for ``s``'s framework."""
    lc = lc or Lifecycle()
    fw = s.framework
    # the engine's own defaults (analytic/lifecycle/): the same functions the estimate reads
    evaluation = eval_runs_for(lc, fw)
    batch = eval_batch_size_for(lc, fw, s.micro_batch_size)
    generate = eval_generates_for(lc, fw)
    sdt = state_dict_type_for(lc, fw)
    device_map = device_map_for(lc, s.quantization)
    sharded = fw in ("accelerate", "torchtitan") and s.fsdp != "none" or s.zero_stage == 3
    return ResolvedLifecycle(
        evaluation=evaluation, eval_batch_size=batch, eval_keeps_logits=lc.eval_keeps_logits,
        eval_batches=lc.eval_batches, eval_accumulation_steps=lc.eval_accumulation_steps,
        eval_generate_tokens=generate, checkpoint_save=lc.checkpoint_save, state_dict_type=sdt,
        save_optimizer=lc.save_optimizer, load_dtype=lc.load_dtype, device_map=device_map, sharded=sharded,
        eval_seq_len=lc.eval_seq_len)
