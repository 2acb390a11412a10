"""One candidate setup: every knob the planner turns, as a small frozen record.

A ``TrainSetup`` (or ``ServeSetup``) is what the search enumerates, the step-time model
times, and the exporters turn into configuration files.  ``to_document`` writes it as a
scenario mapping that ``vramplan estimate`` (and ``vramplan.catalog.resolve.resolve``) accepts,
so every number the planner shows can be reproduced with the estimator alone.

A ``TrainSetup`` is a partial update of the real scenario models, not a copy of their fields:
``train`` and ``parallel`` are ``spec.scenario.Train`` and ``Parallel`` records whose set fields
(``model_fields_set``) are the ones the planner chooses.  ``apply`` lays them on a base scenario
(``model_copy(update=...)``) and ``to_document`` dumps them (``model_dump(exclude_unset=True)``),
so a new scenario field the planner turns is added in one place (``space.py``, where candidates
are made).  The flat names (``checkpointing``, ``lora_rank``, ...) are the plan JSON's ``setup``
keys, a published format: ``FLAT`` maps each to its scenario field, and ``TrainSetup(**setup)``
reads a plan's ``setup`` back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any, Generic, Literal, TypeVar, overload

from vramplan.spec.scenario import Parallel, Peft, Scenario, Train

TrainFramework = Literal["hf-trainer", "deepspeed", "accelerate", "torchtitan"]
PeftMethod = Literal["lora", "qlora"]

__all__ = ["FLAT", "PeftMethod", "ServeSetup", "TrainFramework", "TrainSetup"]

_T = TypeVar("_T")

# The plan JSON's flat ``setup`` keys, in their published order, and the field of the setup each one is:
# (part, field) with part "" for the setup's own fields, "train" / "parallel" for the scenario models'
# and "adapter" for the job's adapter settings (``train.peft`` when the setup trains adapters).
FLAT: dict[str, tuple[str, str]] = {
    "framework": ("", "framework"), "num_gpus": ("", "num_gpus"),
    "micro_batch_size": ("train", "micro_batch_size"), "grad_accum_steps": ("train", "grad_accum_steps"),
    "seq_len": ("train", "seq_len"), "precision": ("train", "precision"), "optimizer": ("train", "optimizer"),
    "checkpointing": ("train", "gradient_checkpointing"), "attention": ("train", "attention"),
    "zero_stage": ("parallel", "zero_stage"), "fsdp": ("parallel", "fsdp"), "offload": ("parallel", "offload"),
    "tp": ("parallel", "tp"), "pp": ("parallel", "pp"), "peft": ("train", "peft"),
    "lora_rank": ("adapter", "rank"), "lora_alpha": ("adapter", "alpha"), "lora_dropout": ("adapter", "dropout"),
    "target_modules": ("adapter", "target_modules"), "quantization": ("train", "quantization"),
    "gpus_per_node": ("", "gpus_per_node"),
    "pp_schedule": ("parallel", "pp_schedule"), "pp_virtual_stages": ("parallel", "pp_virtual_stages"),
}

# The flat names read from the records (``peft`` is the method, set on its own).
_CACHED: tuple[tuple[str, str, str], ...] = tuple((k, p, n) for k, (p, n) in FLAT.items() if p and k != "peft")

# What the planner sets when a candidate does not say (the schema's defaults except the optimizer):
# every setup sets these fields, so its document names them all.
_TRAIN_DEFAULTS: dict[str, Any] = {"precision": "bf16-mixed", "optimizer": "adamw-fused",
                                   "gradient_checkpointing": "none", "attention": "sdpa", "quantization": "none"}
_PARALLEL_DEFAULTS: dict[str, Any] = {"zero_stage": 0, "fsdp": "none", "tp": 1, "pp": 1, "offload": "none"}
# The planner's adapters: rank 16, alpha 32, dropout 0.05 on every linear layer.
_ADAPTER_DEFAULTS: dict[str, Any] = {"rank": 16, "alpha": 32, "dropout": 0.05, "target_modules": "all-linear"}


class _Flat(Generic[_T]):
    """One of ``FLAT``'s fields under its flat name (``s.checkpointing``), read from the records
    (``None`` when a record on the way is None: ``peft`` of a full fine-tuning setup)."""

    def __init__(self, *path: str) -> None:
        self.path = path

    @overload
    def __get__(self, obj: None, owner: type) -> _Flat[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type) -> _T: ...
    def __get__(self, obj: object | None, owner: type) -> _Flat[_T] | _T:
        if obj is None:
            return self
        value: Any = obj
        for name in self.path:
            value = None if value is None else getattr(value, name)
        result: _T = value
        return result


@lru_cache(maxsize=128)
def _adapter(rank: int, alpha: float, dropout: float, target_modules: str | tuple[str, ...],
             method: str | None = None) -> Peft:
    """One validated ``Peft`` per adapter setting and method (a plan's setups share the job's); without a
    method, the job's settings alone (``TrainSetup.adapter``)."""
    targets = target_modules if isinstance(target_modules, str) else list(target_modules)
    kw: dict[str, Any] = {} if method is None else {"method": method}
    return Peft(rank=rank, alpha=alpha, dropout=dropout, target_modules=targets, **kw)


@lru_cache(maxsize=4096)
def _train(items: tuple[tuple[str, Any], ...],
           peft: tuple[int, float, float, str | tuple[str, ...], str] | None) -> Train:
    """One validated ``Train`` per distinct setting: a search makes each two or three times (for
    several GPU counts), and validation is most of a candidate's making."""
    return Train(**dict(items), peft=None if peft is None else _adapter(*peft))


@lru_cache(maxsize=256)
def _parallel(items: tuple[tuple[str, Any], ...]) -> Parallel:
    """One validated ``Parallel`` delta per distinct setting (a search has a few dozen)."""
    return Parallel(**dict(items))


@dataclass(frozen=True, init=False)
class TrainSetup:
    """A training setup on ``num_gpus`` GPUs of one type.

    ``framework`` decides the memory conventions (see docs/conventions.md):
    ``hf-trainer`` = Hugging Face Trainer with DDP (or one GPU); ``deepspeed`` = the Trainer
    or Accelerate driving DeepSpeed ZeRO; ``accelerate`` = the Trainer/Accelerate with
    PyTorch FSDP2; ``torchtitan`` = torchtitan's FSDP2 + tensor + pipeline parallelism.

    ``train`` and ``parallel``: the scenario fields the planner sets (their ``model_fields_set``).
    ``adapter``: the job's adapter settings; ``train.peft`` is this record with the method when the
    setup trains adapters, and None for full fine-tuning.

    Made from flat keywords (``TrainSetup(framework=..., num_gpus=..., micro_batch_size=...,
    checkpointing="full", lora_rank=16)``, the names of ``FLAT``), from the records
    (``train=Train(...)``), or both: flat keywords update the records given
    (``dataclasses.replace(s, num_gpus=8, grad_accum_steps=2)`` works).
    """

    framework: TrainFramework
    num_gpus: int
    train: Train
    parallel: Parallel
    adapter: Peft
    gpus_per_node: int

    def __init__(self, framework: TrainFramework, num_gpus: int, *, train: Train | None = None,
                 parallel: Parallel | None = None, adapter: Peft | None = None, gpus_per_node: int = 8,
                 **flat: Any) -> None:
        t, par, a = dict(_TRAIN_DEFAULTS), dict(_PARALLEL_DEFAULTS), dict(_ADAPTER_DEFAULTS)
        method = None
        if train is not None:
            t.update(_set_fields(train))
            method = None if train.peft is None else train.peft.method
        if parallel is not None:
            par.update(_set_fields(parallel))
        if adapter is not None:
            a.update(_set_fields(adapter))
        method = flat.pop("peft", method)
        parts = {"train": t, "parallel": par, "adapter": a}
        for key, value in flat.items():
            part, name = FLAT.get(key, ("", ""))
            if not part:
                raise TypeError(f"TrainSetup() got an unexpected keyword argument {key!r}")
            parts[part][name] = value
        tm = a["target_modules"]
        adapter_key = (a["rank"], a["alpha"], a["dropout"], tm if isinstance(tm, str) else tuple(tm))
        ad = _adapter(*adapter_key)
        t.pop("peft", None)
        par["sequence_parallel"] = par["tp"] > 1  # Megatron-style sequence parallelism whenever tensor parallel
        records = {"train": _train(tuple(t.items()), None if method is None else (*adapter_key, method)),
                   "parallel": _parallel(tuple(par.items())), "adapter": ad}
        # Frozen: written once, through the instance dict.  The flat names, read about fifty times per
        # candidate by the step-time model and the bound, are cached there beside the records (they cannot
        # disagree with them; without the cache the ``_Flat`` descriptors below read the records).
        d = self.__dict__
        d.update(framework=framework, num_gpus=num_gpus, gpus_per_node=gpus_per_node, **records)
        d.update({key: getattr(records[part], name) for key, part, name in _CACHED})
        d["peft"] = method

    # flat read access for the step-time model, the bound and the exporters (the plan JSON's names)
    micro_batch_size = _Flat[int]("train", "micro_batch_size")
    grad_accum_steps = _Flat[int]("train", "grad_accum_steps")
    seq_len = _Flat[int]("train", "seq_len")
    precision = _Flat[str]("train", "precision")
    optimizer = _Flat[str]("train", "optimizer")
    checkpointing = _Flat[str]("train", "gradient_checkpointing")
    attention = _Flat[str]("train", "attention")
    quantization = _Flat[str]("train", "quantization")
    zero_stage = _Flat[int]("parallel", "zero_stage")
    fsdp = _Flat[str]("parallel", "fsdp")
    offload = _Flat[str]("parallel", "offload")
    tp = _Flat[int]("parallel", "tp")
    pp = _Flat[int]("parallel", "pp")
    pp_schedule = _Flat[str]("parallel", "pp_schedule")
    pp_virtual_stages = _Flat[int]("parallel", "pp_virtual_stages")
    lora_rank = _Flat[int]("adapter", "rank")
    lora_alpha = _Flat[float]("adapter", "alpha")
    lora_dropout = _Flat[float]("adapter", "dropout")
    target_modules = _Flat[list[str] | str]("adapter", "target_modules")

    peft = _Flat[str | None]("train", "peft", "method")  # the adapter method, None for full fine-tuning

    @property
    def dp(self) -> int:
        """Data-parallel degree: GPUs that each see different sequences."""
        return self.num_gpus // (self.parallel.tp * self.parallel.pp)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro-batch x accumulation x data-parallel ranks."""
        return self.train.micro_batch_size * self.train.grad_accum_steps * self.dp

    def family(self) -> tuple[object, ...]:
        """The strategy: setups that differ only in the micro-batch split, the optimizer variant or the
        attention kernel form one family, and a plan lists each family once (its fastest member)."""
        t, p = self.train, self.parallel
        return (self.framework, self.num_gpus, t.precision, t.gradient_checkpointing, p.zero_stage, p.fsdp,
                p.offload, p.tp, p.pp, p.pp_schedule, p.pp_virtual_stages, self.peft, t.quantization)

    def label(self) -> str:
        """A short human name: 'DeepSpeed ZeRO-3 + offload(optimizer), bf16-mixed, ...'."""
        t, p = self.train, self.parallel
        parts: list[str] = []
        if self.framework == "deepspeed":
            parts.append(f"DeepSpeed ZeRO-{p.zero_stage}")
        elif self.framework == "accelerate":
            parts.append(f"FSDP {p.fsdp}")
        elif self.framework == "torchtitan":
            parts.append("torchtitan" + (" FSDP" if self.dp > 1 else "") + (f" TP{p.tp}" if p.tp > 1 else "")
                         + (f" PP{p.pp}" if p.pp > 1 else "")
                         + (f" {p.pp_schedule}" + (f" x{p.pp_virtual_stages}" if p.pp_virtual_stages > 1 else "")
                            if p.pp > 1 and p.pp_schedule != "1f1b" else ""))
        else:
            parts.append("DDP" if self.num_gpus > 1 else "single GPU")
        if p.offload != "none":
            parts.append(f"offload {p.offload}")
        if t.peft is not None:
            parts.append(t.peft.method + (f" ({t.quantization})" if t.quantization != "none" else ""))
        parts.append(t.precision)
        parts.append(t.optimizer)
        if t.gradient_checkpointing != "none":
            parts.append(f"{t.gradient_checkpointing} checkpointing")
        if t.attention != "sdpa":
            parts.append(f"{t.attention} attention")
        parts.append(f"mbs {t.micro_batch_size} x ga {t.grad_accum_steps}")
        return ", ".join(parts)

    def apply(self, base: Scenario) -> Scenario:
        """``base`` with this setup laid on it: the fields the setup sets, nothing else (no validation:
        ``space.py`` makes only values the schema allows, and ``PlanContext.verify`` re-validates)."""
        return base.model_copy(update={
            "task": "train", "framework": self.framework,
            "hardware": base.hardware.model_copy(update={"num_gpus": self.num_gpus,
                                                         "gpus_per_node": self.gpus_per_node}),
            "train": base.train.model_copy(update=_set_fields(self.train)),
            "parallel": base.parallel.model_copy(update=_set_fields(self.parallel)),
        })

    def to_document(self, model: str | dict[str, Any], gpu: str, capacity_gib: float | None = None) -> dict[str, Any]:
        """The scenario mapping for this setup (what ``vramplan estimate`` reads)."""
        train = self.train.model_dump(exclude_unset=True, exclude={"peft"})
        if self.train.peft is not None:  # after quantization, where the planner's documents have it
            train["peft"] = self.train.peft.model_dump()
        hardware: dict[str, Any] = {"gpu": gpu, "num_gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node}
        if capacity_gib is not None:
            hardware["capacity_gib"] = capacity_gib
        return {"model": model, "task": "train", "hardware": hardware, "framework": self.framework, "train": train,
                "parallel": self.parallel.model_dump(exclude_unset=True)}

    def as_dict(self) -> dict[str, Any]:
        """The plan JSON's flat ``setup`` mapping (``FLAT``'s keys and order)."""
        return {key: getattr(self, key) for key in FLAT}


def _set_fields(m: Train | Parallel | Peft | None) -> dict[str, Any]:
    """The fields a record was given (its delta), by name."""
    return {} if m is None else {k: getattr(m, k) for k in m.model_fields_set}


@dataclass(frozen=True, slots=True)
class ServeSetup:
    """A vLLM deployment: ``num_gpus // (tp * pp)`` replicas of one engine each."""

    num_gpus: int
    tp: int
    max_model_len: int
    max_num_seqs: int
    pp: int = 1
    dtype: str = "bf16"
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    gpus_per_node: int = 8

    @property
    def replicas(self) -> int:
        return self.num_gpus // (self.tp * self.pp)

    def family(self) -> tuple[object, ...]:
        return (self.num_gpus, self.tp, self.pp, self.dtype, self.quantization, self.kv_cache_dtype)

    def label(self) -> str:
        parts = [f"vLLM TP{self.tp}" + (f" PP{self.pp}" if self.pp > 1 else "")
                 + (f" x {self.replicas} replicas" if self.replicas > 1 else ""), self.dtype]
        if self.quantization != "none":
            parts.append(f"weights {self.quantization}")
        if self.kv_cache_dtype != "auto":
            parts.append(f"KV {self.kv_cache_dtype}")
        parts.append(f"max_num_seqs {self.max_num_seqs}")
        return ", ".join(parts)

    def to_document(self, model: str | dict[str, Any], gpu: str, capacity_gib: float | None = None) -> dict[str, Any]:
        hardware: dict[str, Any] = {"gpu": gpu, "num_gpus": self.tp * self.pp, "gpus_per_node": self.gpus_per_node}
        if capacity_gib is not None:
            hardware["capacity_gib"] = capacity_gib
        return {
            "model": model, "task": "serve", "hardware": hardware, "framework": "vllm",
            "serve": {"max_model_len": self.max_model_len, "gpu_memory_utilization": self.gpu_memory_utilization,
                      "block_size": self.block_size, "max_num_seqs": self.max_num_seqs,
                      "max_num_batched_tokens": self.max_num_batched_tokens,
                      "kv_cache_dtype": self.kv_cache_dtype, "dtype": self.dtype,
                      "quantization": self.quantization},
            "parallel": {"tp": self.tp, "pp": self.pp},
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
