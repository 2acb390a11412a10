"""Activation checkpointing policies: which one a scenario runs, and which layers it checkpoints.

``train.gradient_checkpointing`` names a policy (docs/conventions.md, Activation checkpointing policies):

* ``full``: a checkpointed layer keeps only its input and is recomputed whole at its backward
  (transformers' ``gradient_checkpointing_enable``, torchtitan's ``mode: full``); with
  ``train.checkpoint_every_n_layers`` n > 1 only every n-th layer is checkpointed, as torchtitan's
  ``selective_ac_option: "n"`` does (``_apply_layer_sac``: ``_layer_sac_count % ac_freq == 0``, the count
  starting at 1);
* ``attention-core``: Megatron's selective recompute (Korthikanti et al., arXiv 2205.05198 sec. 5), only the
  attention's s x s tensors are dropped;
* ``op-sac``: torchtitan's op-level selective checkpointing (``selective_ac_option: "op"``,
  ``_apply_op_sac``): the outputs of the ops on the model's ``_op_sac_save_list`` (``aten.mm`` except every
  second one, the SDPA kernels, reduce-scatter, max) are saved and the rest is recomputed;
* DeepSpeed's partitioned / CPU checkpointing (``train.deepspeed_checkpointing``) stores a full-checkpointed
  layer's input as its 1/tp slice, on the device or in host memory (``checkpointed_input_bytes``);
* ``selective``: the framework's own meaning, op-sac under torchtitan (whose ``mode: selective`` with
  ``selective_ac_option: "op"`` is its documented default) and attention-core elsewhere.
"""

from __future__ import annotations

from typing import Literal

from vramplan.spec.defaults import checkpointing
from vramplan.spec.scenario import Scenario

__all__ = ["CheckpointPolicy", "checkpoint_policy", "checkpointed_input_bytes", "checkpointed_layer",
           "policy_assumption"]

CheckpointPolicy = Literal["none", "full", "attention-core", "op-sac"]


def checkpoint_policy(s: Scenario) -> CheckpointPolicy:
    """The policy the scenario runs (``selective`` resolved by the framework)."""
    g = checkpointing(s)
    if g == "selective":
        return "op-sac" if s.effective_framework == "torchtitan" else "attention-core"
    return g


def checkpointed_layer(s: Scenario, j: int) -> bool:
    """True when layer ``j`` (0-based, in the stage) runs checkpointed: every layer under op-sac, every n-th
    under full (n = ``train.checkpoint_every_n_layers``, torchtitan's count starting at 1)."""
    p = checkpoint_policy(s)
    if p == "op-sac":
        return True
    return p == "full" and (j + 1) % s.train.checkpoint_every_n_layers == 0


def checkpointed_input_bytes(s: Scenario, input_bytes: int) -> tuple[int, int]:
    """(device, host) bytes a checkpointed layer keeps of its ``input_bytes`` input under
    ``train.deepspeed_checkpointing``: partition keeps the 1/tp slice (``partition_activations``:
    ``get_partition_size`` = numel / mp_size), partition+cpu keeps that slice in host memory."""
    mode, tp = s.train.deepspeed_checkpointing, s.parallel.tp
    if mode == "none":
        return input_bytes, 0
    share = -(-input_bytes // tp)
    return (0, share) if mode == "partition+cpu" else (share, 0)


def policy_assumption(s: Scenario) -> str | None:
    """The assumption naming the policy modelled (None without checkpointing, and for plain full checkpointing
    of every layer, whose meaning no framework changes)."""
    g, p, n = checkpointing(s), checkpoint_policy(s), s.train.checkpoint_every_n_layers
    ds = s.train.deepspeed_checkpointing
    if p == "none" or (p == "full" and n == 1 and ds == "none"):
        return None
    said = f"gradient_checkpointing {g}" + (f" under {s.effective_framework}" if g == "selective" else "")
    what = {
        "full": "each checkpointed layer keeps its input and is recomputed whole at its backward"
                + (f"; every {n}-th layer is checkpointed (torchtitan selective_ac_option {n}, _apply_layer_sac), "
                   "the others save everything" if n > 1 else ""),
        "attention-core": "Megatron's selective recompute: only the attention's s x s tensors are dropped "
                          "(arXiv 2205.05198 sec. 5)",
        "op-sac": "torchtitan's op-level selective checkpointing: each layer keeps its input, the outputs of its "
                  "1st, 3rd, ... matmul and of the attention kernel (out, logsumexp), and recomputes the rest "
                  "(activation_checkpoint.py _apply_op_sac, _op_sac_save_list)",
    }[p]
    if ds != "none":
        what += (f"; DeepSpeed {ds}: each checkpointed input keeps its 1/tp slice"
                 + (" in host memory" if ds == "partition+cpu" else "") + " and is gathered back for the recompute "
                 "(checkpointing.py partition_activations; the model is assumed to call "
                 "deepspeed.checkpointing.checkpoint, as Megatron-DeepSpeed does)")
    return f"{said} = {p}: {what}"
