"""The scenario: what runs where.  Validated once, at the edge.

A scenario is one JSON, YAML or TOML document, a dict, or these typed objects.
Every key has a default except ``model`` and ``hardware``; unknown keys are
errors (with a suggestion), so a typo never silently falls back to a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vramplan.facts import Choices, OneOf
from vramplan.facts.optimizers import optimizer_names

Task = Literal["train", "inference", "serve"]
Framework = Literal["hf-trainer", "accelerate", "lightning", "torchtitan", "deepspeed", "vllm", "plain"]
Precision = Literal["fp32", "fp16-mixed", "bf16-mixed", "bf16-true", "fp16-true", "fp8-mixed"]
# the rows of facts/optimizers.py: validated against the table at run time, listed in the JSON schema
Optimizer = Annotated[str, Choices("optimizer", optimizer_names), OneOf(optimizer_names)]
Checkpointing = Literal["none", "full", "selective"]
Attention = Literal["eager", "sdpa", "flash"]
TrainQuant = Literal["none", "int8", "nf4", "nf4-dq", "fp4"]
InferQuant = Literal["none", "int8", "nf4", "nf4-dq", "fp4", "gptq-4bit", "awq-4bit", "fp8"]
HalfDtype = Literal["fp32", "fp16", "bf16"]
KVDtype = Literal["auto", "fp16", "bf16", "fp8", "int8"]
FSDP = Literal["none", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
Offload = Literal["none", "optimizer", "optimizer+params"]
OffloadDevice = Literal["cpu", "nvme"]
VllmVersion = Literal["0.11", "0.19"]
CudaModuleLoading = Literal["lazy", "eager"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hardware(_Strict):
    gpu: str | None = None
    num_gpus: int = Field(1, ge=1, le=100_000)
    capacity_gib: float | None = Field(None, gt=0, le=4096)
    gpus_per_node: int = Field(8, ge=1, le=1024)
    # CUDA_MODULE_LOADING of the run: lazy is PyTorch's default since 1.13 (CUDA >= 11.7) and the
    # driver's from CUDA 12.2; eager for older stacks or CUDA_MODULE_LOADING=EAGER.  Picks the CUDA
    # context size (vramplan.analytic.overhead.cuda_context); no effect on AMD GPUs.
    cuda_module_loading: CudaModuleLoading = "lazy"


class Peft(_Strict):
    method: Literal["lora", "qlora", "dora"] = "lora"
    rank: int = Field(8, ge=1, le=65536)
    alpha: float = 16
    target_modules: list[str] | Literal["all-linear"] = Field(default_factory=lambda: ["q_proj", "v_proj"])
    dropout: float = Field(0.0, ge=0, lt=1)


class Train(_Strict):
    micro_batch_size: int = Field(1, ge=1, le=1_000_000)
    seq_len: int = Field(2048, ge=1, le=100_000_000)
    grad_accum_steps: int = Field(1, ge=1, le=1_000_000)
    precision: Precision = "bf16-mixed"
    optimizer: Optimizer = "adamw"
    gradient_checkpointing: Checkpointing = "none"
    attention: Attention = "sdpa"
    peft: Peft | None = None
    quantization: TrainQuant = "none"


class Inference(_Strict):
    batch_size: int = Field(1, ge=1, le=1_000_000)
    prompt_len: int = Field(512, ge=1, le=100_000_000)
    new_tokens: int = Field(512, ge=0, le=100_000_000)
    dtype: HalfDtype = "bf16"
    quantization: InferQuant = "none"
    kv_cache_dtype: KVDtype = "auto"
    attention: Attention = "sdpa"
    # bitsandbytes 4-bit: the configured compute dtype (transformers' ``bnb_4bit_compute_dtype``, whose
    # default is fp32); None means ``dtype``.  An fp32 or bf16 ``dtype`` overrides it at run time
    # (``Linear4bit.set_compute_type``), so it matters for fp16 models only.
    bnb_compute_dtype: HalfDtype | None = None


class Serve(_Strict):
    max_model_len: int | None = Field(None, ge=1, le=100_000_000)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    block_size: int = Field(16, ge=1, le=1024)
    max_num_seqs: int = Field(256, ge=1, le=1_000_000)
    max_num_batched_tokens: int | None = Field(None, ge=1, le=100_000_000)
    kv_cache_dtype: KVDtype = "auto"
    dtype: HalfDtype = "bf16"
    quantization: InferQuant = "none"
    cuda_graphs: bool = True
    vllm_version: VllmVersion = "0.11"  # behaviour modelled: V1 of vLLM 0.10-0.11, or 0.19


class Parallel(_Strict):
    zero_stage: Literal[0, 1, 2, 3] = 0
    fsdp: FSDP = "none"
    tp: int = Field(1, ge=1, le=1024)
    pp: int = Field(1, ge=1, le=1024)
    cp: int = Field(1, ge=1, le=1024)
    ep: int = Field(1, ge=1, le=1024)
    sequence_parallel: bool = False
    offload: Offload = "none"
    offload_device: OffloadDevice = "cpu"


def _version(text: str | None) -> tuple[int, ...] | None:
    """A release string as a comparable tuple: "4.43.2" -> (4, 43, 2); None stays None."""
    return None if text is None else tuple(int(x) for x in text.split("."))


class Software(_Strict):
    """Library versions whose memory behaviour differs; None means the current release's behaviour."""

    # bitsandbytes before 0.43.2 kept every 4-bit linear's input for the backward
    # (MatMul4Bit: ctx.tensors = (A, B)); PR bitsandbytes-foundation/bitsandbytes#1270 (July 2024) dropped it.
    bitsandbytes: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")

    # peft before 0.12 gave each new LoRA adapter its base weight's floating dtype (LoraLayer.update_layer:
    # ``self.to(weight.device, dtype=weight.dtype)`` when the weight is a float); PR huggingface/peft#1706
    # (merged May 2024, after the 0.11 releases: PR #1874 says so) made get_peft_model upcast fp16/bf16
    # adapters to fp32 (``autocast_adapter_dtype=True``), released in 0.12.0.
    peft: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")

    # transformers 5 fuses a MoE layer's routed experts into two 3-D parameters (``gate_up_proj``
    # [E, 2I, h] and ``down_proj`` [E, h, I], conversion_mapping.py) where 4.x held one ``nn.Linear`` MLP
    # per expert; LoRA on the experts then goes through peft's ``ParamWrapper`` instead of per-expert
    # ``lora.Linear`` layers (analytic/layout.py ``lora_targets``).  Hugging Face ``generate`` before 4.42
    # kept the previous step's cache alive while building the next one, and before 4.45 computed the logits
    # of every prompt position (analytic/inference.py ``GenerateBehaviour``).
    transformers: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")

    @property
    def fused_moe_experts(self) -> bool:
        """True unless the scenario names transformers < 5 (per-expert ``nn.Linear`` MLPs)."""
        v = self.transformers_version
        return v is None or v >= (5,)

    @property
    def transformers_version(self) -> tuple[int, ...] | None:
        return _version(self.transformers)

    @property
    def peft_version(self) -> tuple[int, ...] | None:
        return _version(self.peft)

    @property
    def peft_adapters_in_base_dtype(self) -> bool:
        """True for peft < 0.12: adapters take their base weight's float dtype instead of fp32."""
        v = self.peft_version
        return v is not None and v < (0, 12)

    @property
    def bitsandbytes_version(self) -> tuple[int, ...] | None:
        return _version(self.bitsandbytes)

    @property
    def bnb_4bit_saves_input(self) -> bool:
        """True for bitsandbytes < 0.43.2, whose ``MatMul4Bit`` saved its input ``A`` for the backward."""
        v = self.bitsandbytes_version
        return v is not None and v < (0, 43, 2)


class Scenario(_Strict):
    """A validated scenario.  ``model`` is a catalog id/alias, a path, or an inline config mapping."""

    model: str | dict[str, Any]
    task: Task = "train"
    hardware: Hardware = Field(default_factory=Hardware)
    framework: Framework | None = None
    train: Train = Field(default_factory=Train)
    inference: Inference = Field(default_factory=Inference)
    serve: Serve = Field(default_factory=Serve)
    parallel: Parallel = Field(default_factory=Parallel)
    software: Software = Field(default_factory=Software)

    @field_validator("model")
    @classmethod
    def _model_not_empty(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(v, str) and not v.strip():
            raise ValueError("must name a model (catalog id or alias, a config.json path, or an inline mapping)")
        return v

    @property
    def effective_framework(self) -> Framework:
        if self.framework is not None:
            return self.framework
        if self.task == "serve":
            return "vllm"
        if self.parallel.zero_stage > 0:
            return "deepspeed"
        return "hf-trainer"

    @property
    def data_parallel_degree(self) -> int:
        mp = self.parallel.tp * self.parallel.pp * self.parallel.cp
        return max(1, self.hardware.num_gpus // mp)
