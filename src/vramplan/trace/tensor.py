"""Tensor parallelism traced through transformers' ``tp_plan`` on DTensor under a fake process group.

For ``parallel.tp > 1`` the model is built on the meta device as for one GPU, then sharded with
the installed transformers' own tensor-parallel code, as ``from_pretrained(tp_plan="auto")``
shards it (``transformers/distributed/tensor_parallel.py`` ``apply_tensor_parallelism`` over the
plan that ``_resolve_parallel_plans`` builds from the config's ``base_model_tp_plan`` and the
head's ``_tp_plan``), on a 1-D device mesh of ``tp`` ranks over a fake process group
(``torch.testing._internal.distributed.fake_pg``) in which this process is rank 0.  For Llama,
Mistral and Qwen2 the plan is: q/k/v and gate/up projections colwise (``Shard(0)`` weights),
o and down projections rowwise (``Shard(1)`` weights, output all-reduced), the input embedding
vocabulary-parallel (``embedding_rowwise``: ``Shard(0)``, output all-reduced) and the LM head
``colwise_gather_output`` (``Shard(0)``, logits all-gathered to the full vocabulary on every
rank).  Norms stay replicated.  DeepSpeed's and torchtitan's own tensor-parallel layers (the
latter keeps the logits vocabulary-sharded under ``loss_parallel``) are not traced.

What the tracker sees is rank 0's memory: each sharded parameter counts as its local shard (the
DTensor's ``_local_tensor``, tracker.py), activations carry this rank's heads and MLP columns,
and the functional collectives allocate their outputs as on a GPU (``_c10d_functional.all_reduce``
clones its input and reduces the clone; ``all_gather_into_tensor`` allocates the gathered
tensor).  Two changes make this true on meta tensors, both undone on exit:

* ``_functional_collectives._maybe_wrap_tensor`` returns a meta collective's output itself.  On
  a GPU it wraps it in an ``AsyncCollectiveTensor`` sharing its storage; the wrapping op's fake
  kernel (``_wrap_tensor_autograd``, and ``wait_tensor``'s) allocates an ``empty_like`` copy.
* DTensor's implicit redistribution of an op's inputs (``_dispatch.redistribute_local_tensor``)
  runs inside the op's dispatch, where the tracking mode is not active: it is run with the
  tracker active, so its temporaries are counted.

The data-parallel dimension (DDP, ZeRO, FSDP across the ``num_gpus / tp`` replicas) is derived
from the rank's events by parallel.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vramplan.errors import Problem, ScenarioError
from vramplan.spec.load import Resolved
from vramplan.trace.tracker import Tracker

__all__ = ["TpWorld", "labelled", "tp_traced", "tp_world"]


def tp_traced(r: Resolved) -> bool:
    """Whether the scenario is traced through transformers' tensor-parallel plan."""
    return r.scenario.parallel.tp > 1


def _refuse(r: Resolved) -> None:
    s = r.scenario
    par = s.parallel
    why: list[Problem] = []
    if s.effective_framework in ("deepspeed", "torchtitan"):
        # DeepSpeed: Megatron-DeepSpeed's or AutoTP's own layers; torchtitan: its own plan, whose LM head keeps
        # the logits vocabulary-sharded under loss_parallel
        why.append(Problem("parallel.tp", f"{s.effective_framework}'s tensor parallelism is not traced "
                           "(the trace applies transformers' tp_plan)", "use --engine analytic"))
    if par.sequence_parallel:
        why.append(Problem("parallel.sequence_parallel", "sequence parallelism is not traced",
                           "use --engine analytic"))
    if s.task == "train" and s.train.peft is not None:
        why.append(Problem("train.peft", "adapters under tensor parallelism are not traced", "use --engine analytic"))
    if why:
        raise ScenarioError(why)


@dataclass
class TpWorld:
    """The tensor-parallel mesh of a fake process group."""

    mesh: Any
    tp: int
    notes: list[str] = field(default_factory=list)

    def parallelize(self, r: Resolved, model: torch.nn.Module) -> torch.nn.Module:
        """Shard ``model`` with its transformers tp_plan, as ``from_pretrained(tp_plan="auto")`` does."""
        from transformers.distributed.configuration_utils import DistributedConfig
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism, get_kv_heads_per_rank

        resolve_plans: Callable[..., tuple[dict[str, str], dict[str, str], dict[str, str]]] | None = getattr(
            model, "_resolve_parallel_plans", None)
        if resolve_plans is None:
            raise ScenarioError([Problem("parallel.tp", f"{type(model).__name__} has no tensor-parallel plan",
                                         "use --engine analytic")])
        try:
            plan, _, _ = resolve_plans(DistributedConfig(tp_size=self.tp))
        except ValueError as exc:
            raise ScenarioError([Problem("parallel.tp", str(exc).splitlines()[0][:200],
                                         "use --engine analytic")]) from exc
        config: Any = model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        kv = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        generic = {_generic(k): v for k, v in plan.items()}
        if get_kv_heads_per_rank(generic, kv, self.tp) is None or int(text.num_attention_heads) % self.tp:
            raise ScenarioError([Problem(
                "parallel.tp", f"{text.num_attention_heads} attention heads and {kv} KV heads do not divide "
                f"by tp={self.tp}: transformers' tp_plan splits whole heads only (Megatron would replicate KV heads)",
                "use --engine analytic, or a tp that divides the KV heads")])
        apply_tensor_parallelism(model, self.mesh, plan)
        styles = sorted(set(plan.values()))
        self.notes.append(
            f"tensor parallel tp={self.tp} traced through transformers' tp_plan on DTensor over a fake process group "
            f"(rank 0's memory; styles {', '.join(styles)}): sharded weights, this rank's heads and MLP columns, "
            f"the all-reduce and all-gather outputs as the functional collectives allocate them")
        if any(v in ("colwise_gather_output", "colwise_rep") for v in plan.values()):
            self.notes.append("transformers' LM head (colwise_gather_output) all-gathers the logits: every rank holds "
                              "the full-vocabulary logits and loss")
        if "embedding_rowwise" in plan.values() and r.scenario.task == "train":
            self.notes.append("the vocabulary-parallel embedding's gradient comes out replicated (full vocabulary) on "
                              "every rank: DTensor's embedding backward has no row-sharded strategy")
        if r.scenario.data_parallel_degree > 1:
            self.notes.append("data parallelism across the tp groups derived from the tensor-parallel rank's trace")
        return model


def _generic(name: str) -> str:
    import re

    return re.sub(r"\.\d+(\.|$)", lambda m: ".*" + m.group(1), name)


@contextlib.contextmanager
def tp_world(r: Resolved) -> Iterator[TpWorld]:
    """A fake process group of ``tp`` ranks (this process is rank 0) and a 1-D ``tp`` mesh.

    The process group is destroyed and the patched functions restored on exit.
    """
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    _refuse(r)
    tp = r.scenario.parallel.tp
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; the tensor-parallel trace needs its own fake one")
    wrap = funcol._maybe_wrap_tensor

    def maybe_wrap_tensor(self: Any) -> torch.Tensor:
        # an AsyncCollectiveTensor shares the output's storage; on meta tensors the wrapping op's fake
        # kernel would allocate a copy
        return self if self.device.type == "meta" else wrap(self)

    try:
        funcol._maybe_wrap_tensor = maybe_wrap_tensor
        dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
        mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
        yield TpWorld(mesh, tp)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        funcol._maybe_wrap_tensor = wrap


@contextlib.contextmanager
def labelled(tracker: Tracker) -> Iterator[None]:
    """DTensor's implicit redistributions inside an op's dispatch, counted (the mode is inactive there)."""
    from torch.distributed.tensor import _dispatch

    dispatch: Any = _dispatch
    original = dispatch.redistribute_local_tensor

    def redistribute_local_tensor(*args: Any, **kwargs: Any) -> Any:
        with tracker, tracker.op("DTensor redistribution"):
            return original(*args, **kwargs)

    try:
        dispatch.redistribute_local_tensor = redistribute_local_tensor
        yield
    finally:
        dispatch.redistribute_local_tensor = original
