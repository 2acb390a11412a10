"""Megatron-LM command-line arguments (``pretrain_gpt.py``) for a framework megatron scenario.

The flags are Megatron-LM's own, each a row of facts/megatron.py ``ARGUMENTS`` (read from
``megatron/training/arguments.py`` at ``core_v0.15.0`` with its line); the tests check every flag written against
that table (Megatron-LM itself needs torch and its CUDA extensions to import, so its parser is not run).

What is written: the parallel degrees (``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
``--context-parallel-size``, ``--expert-model-parallel-size``), ``--num-virtual-stages-per-pipeline-rank`` for
``pp_schedule: interleaved-1f1b``, ``--sequence-parallel`` (with tp > 1 only:
``validate_args`` turns it off at tp 1), ``--use-distributed-optimizer``, the batch (``--micro-batch-size``,
``--global-batch-size`` = micro-batch x accumulation steps x data-parallel degree, ``--seq-length``), ``--bf16``
for ``bf16-mixed`` (nothing for fp32), ``--optimizer``, and the recompute settings
(spec/megatron.py: selective -> ``--recompute-granularity selective``; full -> ``--recompute-granularity full
--recompute-method uniform --recompute-num-layers 1``).  The model's architecture arguments (``--num-layers``,
``--hidden-size``, ...) and the data, tokenizer and schedule arguments are the user's: not written.
"""

from __future__ import annotations

from vramplan.errors import Problem, ScenarioError
from vramplan.facts.megatron import MEGATRON_OPTIMIZERS, MEGATRON_PRECISIONS
from vramplan.spec.defaults import checkpointing, megatron_distributed_optimizer
from vramplan.spec.scenario import Scenario

__all__ = ["megatron_arguments"]

_RECOMPUTE = {
    "none": [],
    "selective": ["--recompute-granularity", "selective"],
    "attention-core": ["--recompute-granularity", "selective"],
    "full": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
}


def megatron_arguments(s: Scenario) -> list[str]:
    """Megatron-LM's arguments for ``s`` (a framework megatron training scenario), in the order of the module
    docstring; a ``ScenarioError`` for what no argument here sets."""
    t, par = s.train, s.parallel
    g = checkpointing(s)
    problems = []
    if s.effective_framework != "megatron" or s.task != "train":
        problems.append(Problem("--export", f"Megatron-LM arguments are written for framework megatron, task train "
                                f"(here {s.effective_framework}, {s.task})", "set framework: megatron and task: train"))
    if g not in _RECOMPUTE or t.checkpoint_every_n_layers > 1:
        problems.append(Problem("--export", f"gradient_checkpointing {g} (every {t.checkpoint_every_n_layers} layers) "
                                "has no Megatron-LM recompute arguments here", "use none, selective or full"))
    if t.optimizer not in MEGATRON_OPTIMIZERS or t.precision not in MEGATRON_PRECISIONS:
        problems.append(Problem("--export", f"optimizer {t.optimizer} / precision {t.precision}: no Megatron-LM "
                                "argument runs them", "use optimizer: adamw-fused and precision: bf16-mixed"))
    if problems:
        raise ScenarioError(problems)
    dp = s.data_parallel_degree
    args = ["--tensor-model-parallel-size", str(par.tp), "--pipeline-model-parallel-size", str(par.pp),
            "--context-parallel-size", str(par.cp), "--expert-model-parallel-size", str(par.ep)]
    if par.pp_schedule == "interleaved-1f1b":
        args += ["--num-virtual-stages-per-pipeline-rank", str(par.pp_virtual_stages)]
    if par.sequence_parallel and par.tp > 1:
        args.append("--sequence-parallel")
    if megatron_distributed_optimizer(s):
        args.append("--use-distributed-optimizer")
    args += ["--micro-batch-size", str(t.micro_batch_size),
             "--global-batch-size", str(t.micro_batch_size * t.grad_accum_steps * dp),
             "--seq-length", str(t.seq_len)]
    if MEGATRON_PRECISIONS[t.precision]:
        args.append(MEGATRON_PRECISIONS[t.precision])
    args += ["--optimizer", MEGATRON_OPTIMIZERS[t.optimizer], *_RECOMPUTE[g]]
    return args
