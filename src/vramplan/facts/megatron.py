"""Megatron-LM (Megatron-Core) as data: the command-line arguments the export writes, and the model-state bytes of its
distributed-optimizer documentation, read at one release.

Read at the tag ``core_v0.15.0`` of github.com/NVIDIA/Megatron-LM (commit 0d7e02bd26d3eb347ad8d1bef625002babfa6df7,
``git show core_v0.15.0:path``):

* ``megatron/training/arguments.py``: every ``add_argument`` of ``ARGUMENTS`` at its line (``MegatronArgument``);
  ``--use-distributed-optimizer`` is a ``store_true`` flag (line 2658): off unless given; ``--recompute-granularity``
  (line 2010) takes ``full`` or ``selective``, ``--recompute-method`` (line 2031) ``uniform`` or ``block``,
  ``--recompute-modules`` (line 2045) defaults to ``["core_attn"]``; ``validate_args`` refuses a recompute method with
  selective granularity (lines 914-917) and turns sequence parallelism off at tensor-parallel size 1 (lines 923-928);
  with ``--bf16`` it sets ``accumulate_allreduce_grads_in_fp32`` unless ``--grad-reduce-in-bf16`` (lines 733-748);
* ``megatron/training/training.py`` line 962: ``grad_reduce_in_fp32 = args.accumulate_allreduce_grads_in_fp32`` in the
  ``DistributedDataParallelConfig``; ``megatron/core/distributed/distributed_data_parallel.py`` line 168: the grad
  buffer's dtype is ``torch.float if grad_reduce_in_fp32 else param.dtype`` (fp32 under ``--bf16``);
* ``megatron/core/distributed/param_and_grad_buffer.py`` lines 714-727: the grad buffer (``grad_data``) is one
  ``torch.zeros`` of every parameter's elements, allocated when the model is wrapped; each parameter's ``main_grad`` is
  a view of it (line 752), so the gradients are resident for the whole run; with the distributed optimizer the
  parameters are moved into a ``param_data`` buffer of their own dtype (lines 715-720, the old storage freed:
  ``del old_param_data``), no second copy; each bucket's end is padded to a multiple of lcm(dp, 128) elements
  (lines 566-583, left out: under dp x 128 elements per bucket);
* ``megatron/core/optimizer/distrib_optimizer.py`` lines 382-395: the fp32 main parameter of each bf16 parameter is
  made for this rank's shard only (``shard_model_param.clone().float()``); line 2396: the shard's main gradient is
  ``shard_model_grad.float()``, a view of the fp32 grad buffer (no copy);
* ``megatron/core/optimizer/__init__.py`` lines 10-30: ``--optimizer adam`` is Transformer Engine's ``FusedAdam``
  (else apex's, else torch's ``AdamW``), ``sgd`` its ``FusedSGD`` with ``--sgd-momentum`` 0.9 (arguments.py line 1900);
* ``docs/source/api-guide/dist_optimizer.md`` lines 7-11: the bytes per parameter (``DIST_OPTIMIZER_TABLE``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ARGUMENTS", "DIST_OPTIMIZER_TABLE", "MEGATRON_OPTIMIZERS", "MEGATRON_PRECISIONS", "READ_AT",
           "DistOptimizerRow", "MegatronArgument", "argument_names"]

READ_AT = "core_v0.15.0"
COMMIT = "0d7e02bd26d3eb347ad8d1bef625002babfa6df7"
ARGUMENTS_FILE = "megatron/training/arguments.py"


@dataclass(frozen=True, kw_only=True)
class MegatronArgument:
    """One command-line argument of Megatron-LM's ``arguments.py`` at ``READ_AT``: its flag and the line of its
    ``group.add_argument``; ``choices``: its ``choices=`` list, empty for none."""

    flag: str
    line: int
    choices: tuple[str, ...] = ()


ARGUMENTS: tuple[MegatronArgument, ...] = (
    MegatronArgument(flag="--micro-batch-size", line=1974),
    MegatronArgument(flag="--global-batch-size", line=1981),
    MegatronArgument(flag="--recompute-granularity", line=2010, choices=("full", "selective")),
    MegatronArgument(flag="--recompute-method", line=2031, choices=("uniform", "block")),
    MegatronArgument(flag="--recompute-num-layers", line=2040),
    MegatronArgument(flag="--optimizer", line=2197, choices=("adam", "sgd")),
    MegatronArgument(flag="--sequence-parallel", line=2224),
    MegatronArgument(flag="--bf16", line=2520),
    MegatronArgument(flag="--tensor-model-parallel-size", line=2561),
    MegatronArgument(flag="--pipeline-model-parallel-size", line=2563),
    MegatronArgument(flag="--num-layers-per-virtual-pipeline-stage", line=2584),
    MegatronArgument(flag="--num-virtual-stages-per-pipeline-rank", line=2586),
    MegatronArgument(flag="--use-distributed-optimizer", line=2658),
    MegatronArgument(flag="--context-parallel-size", line=2704),
    MegatronArgument(flag="--seq-length", line=2850),
    MegatronArgument(flag="--expert-model-parallel-size", line=3033),
)


def argument_names() -> frozenset[str]:
    """Every flag of ``ARGUMENTS``."""
    return frozenset(a.flag for a in ARGUMENTS)


# vramplan's optimizer rows Megatron's --optimizer runs: TE's FusedAdam (adam_w_mode from --decoupled-weight-decay,
# fused: no step temporary, as torch's AdamW(fused=True)) and FusedSGD with momentum 0.9
MEGATRON_OPTIMIZERS: dict[str, str] = {"adamw-fused": "adam", "sgd-momentum": "sgd"}
# train.precision values Megatron-LM's own flags mean: --bf16 (bf16 parameters, fp32 grad buffer, fp32 main
# parameters), and neither --bf16 nor --fp16 (fp32 parameters, no main copy)
MEGATRON_PRECISIONS: dict[str, str] = {"bf16-mixed": "--bf16", "fp32": ""}


@dataclass(frozen=True, kw_only=True)
class DistOptimizerRow:
    """One row of the distributed optimizer's table (dist_optimizer.md lines 9-11): bytes per parameter without it,
    and with it as ``fixed + sharded / d`` (d: the data-parallel size)."""

    params: str
    grads: str
    non_distributed: int
    fixed: int
    sharded: int
    line: int


DIST_OPTIMIZER_TABLE: tuple[DistOptimizerRow, ...] = (
    DistOptimizerRow(params="fp16", grads="fp16", non_distributed=20, fixed=4, sharded=16, line=9),
    DistOptimizerRow(params="bf16", grads="fp32", non_distributed=18, fixed=6, sharded=12, line=10),
    DistOptimizerRow(params="fp32", grads="fp32", non_distributed=16, fixed=8, sharded=8, line=11),
)
