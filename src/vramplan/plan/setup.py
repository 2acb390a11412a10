"""One candidate setup: every knob the planner turns, as a small frozen record.

A ``TrainSetup`` (or ``ServeSetup``) is what the search enumerates, the step-time model
times, and the exporters turn into configuration files.  ``to_document`` writes it as a
scenario mapping that ``vramplan estimate`` (and ``vramplan.spec.load.resolve``) accepts,
so every number the planner shows can be reproduced with the estimator alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

TrainFramework = Literal["hf-trainer", "deepspeed", "accelerate", "torchtitan"]
PeftMethod = Literal["lora", "qlora"]

__all__ = ["PeftMethod", "ServeSetup", "TrainFramework", "TrainSetup"]


@dataclass(frozen=True, slots=True)
class TrainSetup:
    """A training setup on ``num_gpus`` GPUs of one type.

    ``framework`` decides the memory conventions (see docs/conventions.md):
    ``hf-trainer`` = Hugging Face Trainer with DDP (or one GPU); ``deepspeed`` = the Trainer
    or Accelerate driving DeepSpeed ZeRO; ``accelerate`` = the Trainer/Accelerate with
    PyTorch FSDP2; ``torchtitan`` = torchtitan's FSDP2 + tensor + pipeline parallelism.
    """

    framework: TrainFramework
    num_gpus: int
    micro_batch_size: int
    grad_accum_steps: int
    seq_len: int
    precision: str = "bf16-mixed"
    optimizer: str = "adamw-fused"
    checkpointing: str = "none"
    attention: str = "sdpa"
    zero_stage: int = 0
    fsdp: str = "none"
    offload: str = "none"
    tp: int = 1
    pp: int = 1
    peft: PeftMethod | None = None
    lora_rank: int = 16
    lora_alpha: float = 32
    lora_dropout: float = 0.05
    target_modules: str = "all-linear"
    quantization: str = "none"
    gpus_per_node: int = 8

    @property
    def dp(self) -> int:
        """Data-parallel degree: GPUs that each see different sequences."""
        return self.num_gpus // (self.tp * self.pp)

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: micro-batch x accumulation x data-parallel ranks."""
        return self.micro_batch_size * self.grad_accum_steps * self.dp

    def family(self) -> tuple[object, ...]:
        """The strategy: setups that differ only in the micro-batch split, the optimizer variant or the
        attention kernel form one family, and a plan lists each family once (its fastest member)."""
        return (self.framework, self.num_gpus, self.precision, self.checkpointing, self.zero_stage, self.fsdp,
                self.offload, self.tp, self.pp, self.peft, self.quantization)

    def label(self) -> str:
        """A short human name: 'DeepSpeed ZeRO-3 + offload(optimizer), bf16-mixed, ...'."""
        parts: list[str] = []
        if self.framework == "deepspeed":
            parts.append(f"DeepSpeed ZeRO-{self.zero_stage}")
        elif self.framework == "accelerate":
            parts.append(f"FSDP {self.fsdp}")
        elif self.framework == "torchtitan":
            parts.append("torchtitan" + (" FSDP" if self.dp > 1 else "") + (f" TP{self.tp}" if self.tp > 1 else "")
                         + (f" PP{self.pp}" if self.pp > 1 else ""))
        else:
            parts.append("DDP" if self.num_gpus > 1 else "single GPU")
        if self.offload != "none":
            parts.append(f"offload {self.offload}")
        if self.peft:
            parts.append(self.peft + (f" ({self.quantization})" if self.quantization != "none" else ""))
        parts.append(self.precision)
        parts.append(self.optimizer)
        if self.checkpointing != "none":
            parts.append(f"{self.checkpointing} checkpointing")
        if self.attention != "sdpa":
            parts.append(f"{self.attention} attention")
        parts.append(f"mbs {self.micro_batch_size} x ga {self.grad_accum_steps}")
        return ", ".join(parts)

    def to_document(self, model: str | dict[str, Any], gpu: str, capacity_gib: float | None = None) -> dict[str, Any]:
        """The scenario mapping for this setup (what ``vramplan estimate`` reads)."""
        train: dict[str, Any] = {
            "micro_batch_size": self.micro_batch_size, "seq_len": self.seq_len,
            "grad_accum_steps": self.grad_accum_steps, "precision": self.precision,
            "optimizer": self.optimizer, "gradient_checkpointing": self.checkpointing,
            "attention": self.attention, "quantization": self.quantization,
        }
        if self.peft is not None:
            train["peft"] = {"method": self.peft, "rank": self.lora_rank, "alpha": self.lora_alpha,
                             "target_modules": self.target_modules, "dropout": self.lora_dropout}
        hardware: dict[str, Any] = {"gpu": gpu, "num_gpus": self.num_gpus, "gpus_per_node": self.gpus_per_node}
        if capacity_gib is not None:
            hardware["capacity_gib"] = capacity_gib
        return {
            "model": model, "task": "train", "hardware": hardware, "framework": self.framework, "train": train,
            "parallel": {"zero_stage": self.zero_stage, "fsdp": self.fsdp, "tp": self.tp, "pp": self.pp,
                         "sequence_parallel": self.tp > 1, "offload": self.offload},
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
