"""ZeRO-3 / FSDP traced through FSDP2's ``fully_shard`` under a fake process group.

For a scenario with parameter sharding (``parallel.fsdp`` full_shard / shard_grad_op /
hybrid_shard, or ``parallel.zero_stage`` 3), the model is wrapped with the real FSDP2 code of the
installed torch (``torch.distributed.fsdp.fully_shard``) on a device mesh of the scenario's
world size, and the step is traced as rank 0 runs it.  A fake process group
(``torch.testing._internal.distributed.fake_pg``) answers every collective without moving data,
so the all-gather outputs, the unsharded parameters, the reduce-scatter inputs and outputs, the
sharded gradients and the optimizer's sharded states are allocated, kept and released by FSDP2
itself.  What the tracker sees is rank 0's memory; every rank holds the same shapes (dim-0
shards padded to ``ceil(dim0 / world)`` rows, ``_fsdp_param.py``).

Wrapping, as the frameworks do it:

* every decoder layer (the classes in the model's ``_no_split_modules``, accelerate's
  ``TRANSFORMER_BASED_WRAP``; torchtitan's ``apply_fsdp`` per ``TransformerBlock``), then the root;
* hf-trainer / accelerate: accelerate's ``fsdp2_prepare_model`` (accelerate 1.15,
  ``utils/fsdp_utils.py``) also gives the input embedding a unit of its own and the final norm
  plus the LM head a unit with ``reshard_after_forward=False``;
* ``reshard_after_forward`` True for full_shard / hybrid_shard / ZeRO-3, False for shard_grad_op;
  the root takes ``fully_shard``'s default (``None``: not resharded after forward);
* torchtitan as ``software.torchtitan`` says, as the analytic engine does (analytic/terms/sharding.py): up to
  v0.1 (null) ``apply_fsdp`` at commit 9dec370, each block (the last not resharded after forward) and then the
  model, whose root unit holds the embedding, the final norm and the head and is not resharded after forward
  (torch <= 2.7 kept the root unsharded whatever it was given, ``FSDPState._lazy_init``: here ``fully_shard``'s
  default ``None`` does that); from v0.2.0 (commit 83e6941) the embedding and ``[norm, output]`` units of
  their own, as accelerate wraps them, every block resharded after forward;
* hybrid_shard: a 2-D mesh (replicas x ``gpus_per_node`` shards): HSDP, reduce-scatter in the
  node, all-reduce across nodes.

Precision (``MixedPrecisionPolicy``): ``*-mixed`` keeps fp32 sharded parameters and all-gathers
``param_dtype`` half copies; the reduce dtype is fp32 (torchtitan's ``mixed_precision_reduce``
default) except under accelerate, whose policy for ``mixed_precision="bf16"`` is
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16)``
(``utils/dataclasses.py``, ``set_mixed_precision``); ``*-true`` and fp32 keep everything in the
stored dtype.  Gradients are kept in the sharded parameters' dtype.

FSDP2 runs on meta tensors with four changes, all undone when the context ends: the check
that no parameter is on the meta device (``FSDPParamGroup._validate_no_meta_params``) is
skipped, the meta device's stream/event handle is a single stream whose events are always
complete (allocation order is program order), and each parameter group's device is the meta device so that its
all-gather and reduce-scatter buffers are meta tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vramplan.spec.load import Resolved
from vramplan.trace.tracker import Tracker

__all__ = ["FsdpWorld", "fake_world", "fsdp_traced", "module_getter", "world_shape"]

SHARDED = ("full_shard", "shard_grad_op", "hybrid_shard")


def fsdp_traced(r: Resolved) -> bool:
    """Whether the scenario's step is traced through ``fully_shard`` (else parallel.py derives it)."""
    s = r.scenario
    par = s.parallel
    if s.task != "train" or s.data_parallel_degree <= 1:
        return False
    if max(par.tp, par.pp, par.cp, par.ep) > 1 or par.offload != "none":
        return False
    if s.train.peft is not None and s.train.quantization != "none":
        return False  # bitsandbytes' packed uint8 weights: accelerate leaves them out of sharding
    if s.train.precision in ("fp8-mixed", "fp8-torchao", "mxfp8-torchao"):
        return False
    return par.fsdp in SHARDED or (par.fsdp == "none" and par.zero_stage >= 3)


def world_shape(r: Resolved) -> tuple[int, ...]:
    """The device mesh: (world,) or, for hybrid_shard, (replicas, shards per replica group)."""
    s = r.scenario
    dp = s.data_parallel_degree
    if s.parallel.fsdp == "hybrid_shard":
        group = max(1, min(dp, s.hardware.gpus_per_node))
        if group < dp and dp % group == 0:
            return (dp // group, group)
    return (dp,)


@dataclass
class FsdpWorld:
    """The mesh of a fake process group and how the scenario wraps its model."""

    mesh: Any
    shape: tuple[int, ...]
    notes: list[str] = field(default_factory=list)

    def shard(self, r: Resolved, model: torch.nn.Module) -> torch.nn.Module:
        """Apply ``fully_shard`` as the scenario's framework does; returns the same module."""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        s = r.scenario
        framework = s.effective_framework
        reshard = s.parallel.fsdp != "shard_grad_op"
        kwargs: dict[str, Any] = {"mesh": self.mesh, "reshard_after_forward": reshard,
                                  "mp_policy": _mp_policy(r)}
        layers = _decoder_layers(model)
        # torchtitan up to v0.1, and from v0.2 on a tied model (one [embedding, norm, head] unit, as the analytic
        # engine's terms/sharding.py split_units): the v0.1 layout
        root_unit = framework == "torchtitan" and not (s.software.torchtitan_split_units
                                                       and not r.model.tie_word_embeddings)
        for i, layer in enumerate(layers):
            # torchtitan up to v0.1: "do not reshard after forward for the last transformer block"
            keep = root_unit and i == len(layers) - 1
            fully_shard(layer, **{**kwargs, "reshard_after_forward": reshard and not keep})
        units = [f"{len(layers)} decoder layers" + (" (the last not resharded after forward)" if root_unit else "")]
        if framework in ("hf-trainer", "accelerate", "torchtitan") and not root_unit:
            emb = module_getter(model, "get_input_embeddings")
            out = module_getter(model, "get_output_embeddings")
            tied = emb is not None and out is not None and getattr(emb, "weight", None) is getattr(out, "weight", 1)
            if emb is not None and not tied:
                fully_shard(emb, **kwargs)
                units.append("input embedding")
            norm = _final_norm(model)
            tail = [m for m in ((norm, emb, out) if tied else (norm, out)) if m is not None
                    and not isinstance(m, FSDPModule)]
            if tail:
                fully_shard(tail, **{**kwargs, "reshard_after_forward": False})
                units.append("final norm + LM head (not resharded after forward)")
        root = {k: v for k, v in kwargs.items() if k != "reshard_after_forward"}
        fully_shard(model, **root)
        units.append("root (embedding, final norm, head)" if root_unit else "root")
        _meta_groups(model)
        mesh = " x ".join(str(n) for n in self.shape)
        what = "ZeRO-3" if s.parallel.fsdp == "none" else f"FSDP {s.parallel.fsdp}"
        self.notes.append(
            f"{what} traced through FSDP2 fully_shard on a fake process group (mesh {mesh}; rank 0's "
            f"memory): units {', '.join(units)}; reshard_after_forward={reshard}; {_policy_text(r)}")
        if s.parallel.fsdp == "none":
            self.notes.append("ZeRO-3 modelled as FSDP2 full_shard of the half module (DeepSpeed's half partitions) "
                              "with fp32 master partitions held by the optimizer; DeepSpeed gathers per submodule "
                              "with its own prefetch bucket and persistence threshold, which are not traced")
        self.notes.append("FSDP2's all-gather and reduce-scatter buffers come from one allocator pool "
                          "(CUDA keeps a pool per stream); collectives run in program order")
        return model


def module_getter(model: torch.nn.Module, name: str) -> torch.nn.Module | None:
    """``model.<name>()`` (e.g. ``get_output_embeddings``) when it returns a module, else None."""
    fn = getattr(model, name, None)
    if fn is None:
        return None
    try:
        out = fn()
    except (NotImplementedError, AttributeError):
        return None
    return out if isinstance(out, torch.nn.Module) else None


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of the classes in ``_no_split_modules`` (transformers' decoder layers)."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists: list[list[torch.nn.Module]] = [list(m) for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(lists, key=len) if lists else []


def _final_norm(model: torch.nn.Module) -> torch.nn.Module | None:
    base: Any = model
    for attr in ("base_model", "model"):
        while hasattr(base, attr) and isinstance(getattr(base, attr), torch.nn.Module) and getattr(base, attr) is not base:
            base = getattr(base, attr)
    for attr in ("norm", "final_layernorm", "ln_f", "final_layer_norm"):
        m = getattr(base, attr, None)
        if isinstance(m, torch.nn.Module):
            return m
    return None


def _mp_policy(r: Resolved) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    prec = r.scenario.train.precision
    if not prec.endswith("-mixed") or r.scenario.deepspeed_engine:
        # DeepSpeed: a half module (its partitions are half), fp32 masters held by the optimizer
        return MixedPrecisionPolicy()
    half = torch.float16 if prec.startswith("fp16") else torch.bfloat16
    if r.scenario.effective_framework in ("hf-trainer", "accelerate"):
        return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=half, output_dtype=half)
    return MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)


def _policy_text(r: Resolved) -> str:
    mp = _mp_policy(r)
    if mp.param_dtype is None:
        return "no MixedPrecisionPolicy (parameters all-gathered and gradients reduced in their stored dtype)"
    return (f"MixedPrecisionPolicy(param_dtype={str(mp.param_dtype).removeprefix('torch.')}, "
            f"reduce_dtype={str(mp.reduce_dtype).removeprefix('torch.')}) over fp32 sharded parameters")


def _meta_groups(model: torch.nn.Module) -> None:
    """Each parameter group's buffers on the meta device, with a single-stream handle."""
    from torch.distributed.fsdp import FSDPModule

    meta = torch.device("meta")
    for mod in model.modules():
        if isinstance(mod, FSDPModule):
            state: Any = mod._get_fsdp_state()
            state._device = meta  # the communication context's streams come from the root state's device
            state._device_handle = META_HANDLE
            group = state._fsdp_param_group
            if group is not None:
                group.device = meta
                group.device_handle = META_HANDLE
                for p in group.fsdp_params:
                    p.device = meta


class _Event:
    """A stream event that is always complete (the trace runs in program order)."""

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class _Stream:
    def __init__(self, priority: int = 0) -> None:
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def record_event(self, event: Any = None) -> _Event:
        return _Event()

    def synchronize(self) -> None:
        return None


class _MetaHandle:
    """The device module FSDP2 asks for streams and events (``torch.cuda`` on a GPU): one stream."""

    Stream = _Stream
    Event = _Event
    _current = _Stream()

    @staticmethod
    def stream(stream: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    @classmethod
    def current_stream(cls, device: Any = None) -> _Stream:
        return cls._current

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None


META_HANDLE = _MetaHandle()


def _meta_handle(original: Callable[..., Any]) -> Callable[..., Any]:
    def handle(device_type: str = "cuda") -> Any:
        return META_HANDLE if device_type == "meta" else original(device_type)

    return handle


@contextlib.contextmanager
def fake_world(shape: tuple[int, ...]) -> Iterator[FsdpWorld]:
    """A fake process group of ``prod(shape)`` ranks (this process is rank 0) and FSDP2 on meta tensors.

    Everything is undone on exit: the patched functions are restored and the process group is
    destroyed, so a later ``fully_shard`` behaves as torch ships it.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as col
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pgroup
    from torch.distributed.fsdp._fully_shard import _fsdp_state as fstate
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised; the FSDP2 trace needs its own fake one")
    world = 1
    for n in shape:
        world *= n
    patched: list[tuple[Any, str, Any]] = [(pgroup.FSDPParamGroup, "_validate_no_meta_params",
                                            pgroup.FSDPParamGroup.__dict__["_validate_no_meta_params"])]
    for mod in (col, pgroup, fstate):
        patched.append((mod, "_get_device_handle", mod._get_device_handle))
    # finalize_backward waits on a prefetched all-gather nobody used (a frozen embedding's, under
    # PEFT) through torch.accelerator, which has no device here
    patched.append((torch.accelerator, "current_stream", torch.accelerator.current_stream))
    try:
        setattr(torch.accelerator, "current_stream", _MetaHandle.current_stream)  # noqa: B010
        setattr(pgroup.FSDPParamGroup, "_validate_no_meta_params", lambda self: None)  # noqa: B010
        for mod in (col, pgroup, fstate):
            setattr(mod, "_get_device_handle", _meta_handle(mod._get_device_handle))  # noqa: B010
        dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
        names = ("dp_replicate", "dp_shard") if len(shape) == 2 else ("dp_shard",)
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        yield FsdpWorld(mesh, shape)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for owner, attr, value in reversed(patched):
            setattr(owner, attr, value)


@contextlib.contextmanager
def labelled(tracker: Tracker) -> Iterator[None]:
    """FSDP2's own allocations under their names: all-gathers are parameters, reductions temporaries.

    ``unshard`` allocates the all-gather output (copy-in buffer included), ``wait_for_unshard``
    the unsharded parameters; ``post_backward`` the reduce-scatter input and output (the kept
    sharded gradients are relabelled ``gradients`` when the backward ends).  FSDP2 frees an
    unsharded parameter by resizing its storage to 0 and re-allocates it by resizing it back
    (``_fsdp_param.py`` ``free_storage`` / ``alloc_storage``), which no op shows: both are told
    to the tracker.
    """
    from torch.distributed.fsdp._fully_shard import _fsdp_param as fparam
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pgroup
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    alloc, free = fparam.alloc_storage, fparam.free_storage

    def alloc_storage(tensor: torch.Tensor) -> None:
        alloc(tensor)
        tracker.resized(tensor, tensor.untyped_storage().nbytes())

    def free_storage(tensor: torch.Tensor) -> None:
        tracker.resized(tensor, 0)
        free(tensor)

    storage_patches = [(fparam, "alloc_storage", alloc, alloc_storage), (fparam, "free_storage", free, free_storage),
                       (pgroup, "alloc_storage", getattr(pgroup, "alloc_storage"), alloc_storage)]  # noqa: B009

    def wrap(name: str, category: str, op: str) -> tuple[str, Any, Any]:
        original = FSDPParamGroup.__dict__[name]

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            with tracker.category(category), tracker.op(op):
                return original(self, *args, **kwargs)

        return name, original, method

    wrapped = [wrap("unshard", "weights", "all-gathered (FSDP2 all-gather buffer)"),
               wrap("wait_for_unshard", "weights", "all-gathered (FSDP2 unsharded parameters)"),
               wrap("post_backward", "temporaries", "FSDP2 reduce-scatter")]
    try:
        for name, _, method in wrapped:
            setattr(FSDPParamGroup, name, method)
        for owner, attr, _, fn in storage_patches:
            setattr(owner, attr, fn)
        yield
    finally:
        for name, original, _ in wrapped:
            setattr(FSDPParamGroup, name, original)
        for owner, attr, original, _ in storage_patches:
            setattr(owner, attr, original)
