"""The scenario: what runs where.  Validated once, at the edge.

A scenario is one JSON, YAML or TOML document, a dict, or these typed objects.
Every key has a default except ``model`` and ``hardware``; unknown keys are
errors (with a suggestion), so a typo never silently falls back to a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from vramplan.facts import Choices, OneOf
from vramplan.facts.optimizers import optimizer_names
from vramplan.facts.pipeline_schedules import pipeline_schedule_names
from vramplan.facts.trainer_frameworks import trainer_framework
from vramplan.facts.vllm_releases import parse_release
from vramplan.spec.fields import changed_fields

Task = Literal["train", "inference", "serve"]
Framework = Literal["hf-trainer", "accelerate", "lightning", "torchtitan", "deepspeed", "vllm", "plain", "autoawq",
                    "torchtune", "litgpt", "verl", "megatron", "openrlhf", "axolotl", "llamafactory"]
Precision = Literal["fp32", "fp16-mixed", "bf16-mixed", "bf16-true", "fp16-true", "fp8-mixed", "fp8-torchao",
                    "mxfp8-torchao"]
# the rows of facts/optimizers.py: validated against the table at run time, listed in the JSON schema
Optimizer = Annotated[str, Choices("optimizer", optimizer_names), OneOf(optimizer_names)]
Checkpointing = Literal["none", "full", "selective", "attention-core", "op-sac"]
Attention = Literal["eager", "sdpa", "flash"]
TrainQuant = Literal["none", "int8", "nf4", "nf4-dq", "fp4"]
InferQuant = Literal["none", "int8", "nf4", "nf4-dq", "fp4", "gptq-4bit", "awq-4bit", "fp8", "mxfp4", "fp8-block",
                     "gptq-3bit", "gptq-8bit", "ct-w4a16", "ct-w8a8-int8", "ct-fp8", "ct-nvfp4", "ct-nvfp4a16", "modelopt-nvfp4", "modelopt-fp8", "fp8-tensor",
                     "fp8-tensor-static", "ct-fp8-tensor", "ct-fp8-tensor-static", "hqq-4bit", "hqq-8bit", "ao-int4", "ao-fp8", "ao-int8"]
HalfDtype = Literal["fp32", "fp16", "bf16"]
# vLLM's --dtype: auto (its default) or a dtype
ServeDtype = Literal["auto", "fp32", "fp16", "bf16"]
KVDtype = Literal["auto", "fp16", "bf16", "fp8", "int8"]
FSDP = Literal["none", "full_shard", "shard_grad_op", "hybrid_shard", "no_shard"]
Offload = Literal["none", "optimizer", "optimizer+params"]
OffloadDevice = Literal["cpu", "nvme"]
# the rows of facts/pipeline_schedules.py
PipelineScheduleName = Annotated[str, Choices("pp_schedule", pipeline_schedule_names), OneOf(pipeline_schedule_names)]


def _vllm_release(value: str) -> str:
    parse_release(value)  # a ValueError names the accepted range and the nearest release
    return value


# a vLLM release string from facts/vllm_releases.py OLDEST to NEWEST ("0.11", "0.10.2", "0.8.5.post1")
VllmVersion = Annotated[str, AfterValidator(_vllm_release)]
ServeEngine = Literal["vllm", "sglang", "llamacpp"]
CudaModuleLoading = Literal["lazy", "eager"]
DeepSpeedCheckpointing = Literal["none", "partition", "partition+cpu"]
LoadDtype = Literal["auto", "fp32"]
DeviceMap = Literal["auto", "none"]
StateDictType = Literal["full", "full_offload", "sharded"]
LossKernel = Literal["standard", "liger-fused-linear-ce", "cut-cross-entropy", "chunked"]
ActivationOffload = Literal["none", "cpu"]
TorchaoOffload = Literal["none", "optimizer", "optimizer+gradients"]
Objective = Literal["sft", "dpo", "kto", "orpo", "grpo", "ppo", "rloo"]
RolloutEngine = Literal["vllm", "hf-generate"]
AutoAwqLoop = Literal["forward", "generate"]
ReferenceModel = Literal["none", "shared", "separate"]
Float8Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]
MXRecipe = Literal["mxfp8_cublas", "mxfp8_cublas_rceil", "mxfp8_emulated"]


class _Strict(BaseModel):
    # Each field's attribute docstring becomes its ``description`` (vLLM's ``vllm/config/cache.py`` does the
    # same), so the JSON schema, ``vramplan estimate --help`` (``cli/flags.py``) and the docs read one text.
    # A docstring's first paragraph is the short help; later paragraphs give the source.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Hardware(_Strict):
    """The GPUs the job runs on."""

    gpu: str | None = None
    """GPU name or alias from the catalog (see `vramplan gpus`); its total_memory is the capacity.

    Names match without spaces, hyphens and dots when that stays unambiguous; a bare family name
    ("a100") resolves to the larger variant (docs/conventions.md, Capacity)."""

    num_gpus: int = Field(1, ge=1, le=100_000)
    """GPUs in the job (the world size: dp x tp x pp x cp, docs/glossary.md)."""

    capacity_gib: float | None = Field(None, gt=0, le=4096)
    """Device capacity in GiB (2^30 B), for a GPU not in the catalog; with a catalog GPU it replaces its
    total_memory."""

    gpus_per_node: int = Field(8, ge=1, le=1024)
    """GPUs per node: groups inside a node are intra-node, larger ones inter-node (FSDP hybrid_shard shards
    within a node)."""

    cuda_module_loading: CudaModuleLoading = "lazy"
    """CUDA_MODULE_LOADING of the run; picks the CUDA context size (no effect on AMD GPUs).

    lazy is PyTorch's default since 1.13 (CUDA >= 11.7) and the driver's from CUDA 12.2; eager for older
    stacks or CUDA_MODULE_LOADING=EAGER.  The context is the median of the published rows for the GPU's
    architecture and this mode (vramplan.analytic.overhead.cuda_context; docs/conventions.md, Memory
    outside tensors)."""

    memory_in_use_gib: float = Field(0, ge=0, le=4096, allow_inf_nan=False)
    """GiB (2^30 B) that other processes hold on each GPU when the job starts: a desktop session on the same
    GPU (a display under Windows' WDDM or X11 takes about 0.3-1.5 GiB), a notebook kernel that keeps a model, a
    second job.  This job's capacity is the device's memory less this; engines that size themselves from the
    memory free at start (SGLang, llama.cpp, vLLM's free-memory check) see it too (docs/conventions.md,
    Capacity).  0 assumes the GPU is otherwise empty, as on a cluster node."""


class Peft(_Strict):
    """Parameter-efficient fine-tuning: adapters on a frozen base (docs/glossary.md, PEFT)."""

    method: Literal["lora", "qlora", "dora"] = "lora"
    """Adapter method: LoRA (low-rank adapters), QLoRA (LoRA over a 4-bit base), DoRA (LoRA plus a
    magnitude vector per output feature)."""

    rank: int = Field(8, ge=1, le=65536)
    """Adapter rank r: each adapted d_out x d_in linear gains r x (d_in + d_out) trainable parameters."""

    alpha: float = Field(16, gt=0, le=1_000_000, allow_inf_nan=False)
    """Adapter alpha (the update is scaled by alpha / r); no effect on memory."""

    target_modules: list[str] | Literal["all-linear"] | None = None
    """Module names that get adapters (peft's ``target_modules``), or all-linear; on the command line a
    comma-separated list.  null: PEFT's default for the model type (``LoraConfig(target_modules=None)``;
    facts/peft_targets.py), e.g. q_proj, v_proj on Llama, query_key_value on Falcon; where PEFT has none,
    q_proj, v_proj as an assumption.  Under framework lightning, Lit-GPT's own default (the query and the value:
    q_proj, v_proj); under torchtune, whose builders require lora_attn_modules, null is refused.

    On transformers 5 MoE models, expert names become adapters on the fused expert parameters
    (docs/conventions.md, LoRA on MoE experts)."""

    dropout: float = Field(0.0, ge=0, lt=1)
    """Adapter dropout probability; above 0 each adapted input keeps a dropped copy for the backward."""


class Float8Training(_Strict):
    """torchao float8 training (``train.precision: fp8-torchao``): the ``Float8LinearConfig`` that
    ``convert_to_float8_training`` swaps each ``nn.Linear`` with, as torchtitan's ``[float8]`` job-config
    section names the settings (torchtitan ``config/job_config.py`` ``Float8``; torchao v0.14.1
    ``torchao/float8/config.py``).  Read only with that precision (docs/conventions.md, torchao float8)."""

    recipe_name: Float8Recipe = "tensorwise"
    """Scaling recipe: tensorwise (``Float8LinearConfig()``: one scale per tensor, e4m3 input and weight, e5m2
    gradient), rowwise (one scale per row, e4m3 throughout) or rowwise_with_gw_hp (rowwise, the weight gradient in
    high precision).  torchao ``Float8LinearConfig.from_recipe_name``; tensorwise is torchao's default and
    torchtitan's when ``recipe_name`` is unset (v0.1.0 to v0.2.2, the releases the job-config export writes;
    torchtitan b5bcd76, 2026, offers only the rowwise recipes, rowwise by default, and no float8 all-gather)."""

    enable_fsdp_float8_all_gather: bool = False
    """FSDP2 all-gathers the converted weights in float8 (cast before the all-gather): 1 byte per element in the
    all-gather buffers instead of bf16's 2.  tensorwise only, with parameter sharding (torchao
    ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``)."""

    precompute_float8_dynamic_scale_for_fsdp: bool = False
    """One all-reduce after the optimizer step computes every converted weight's scale (torchao
    ``precompute_float8_dynamic_scale_for_fsdp``): one fp32 scale per converted weight kept beside it.  Needs
    enable_fsdp_float8_all_gather."""

    force_recompute_fp8_weight_in_bwd: bool = False
    """torchtitan's flag of that name; deprecated in torchao (no effect since torchao's linear saves the
    high-precision weight and casts it again in the backward, pytorch/ao#2251): accepted with tensorwise, adds
    nothing."""

    convert_lm_head: bool | None = None
    """Whether the LM head is converted too; null: the framework's default, false under torchtitan (its Llama 3
    train configs set ``filter_fqns = ["output"]``), true for plain torchao (``convert_to_float8_training``
    without a filter converts every ``nn.Linear`` whose dimensions are multiples of 16)."""


class MXTraining(_Strict):
    """torchao MXFP8 training (``train.precision: mxfp8-torchao``): the ``MXLinearConfig`` recipe torchtitan's
    ``mx`` converter swaps each ``nn.Linear`` with (torchtitan ``MXLinearConverter``, commit f7a56e60; torchao
    v0.14.1 ``torchao/prototype/mx_formats/config.py``).  Read only with that precision (docs/conventions.md,
    torchao MXFP8)."""

    recipe_name: MXRecipe = "mxfp8_cublas"
    """MX recipe (e4m3 elements, one e8m0 scale per 32): mxfp8_cublas (cuBLAS MX gemm, CUDA dim1 cast kernel; torchtitan's
    default), mxfp8_cublas_rceil (the same with RCEIL scales) or mxfp8_emulated (bf16 gemm on dequantized operands,
    eager dim1 casts of transposed copies).  torchao ``MXLinearConfig.from_recipe_name``."""

    convert_lm_head: bool | None = None
    """Whether the LM head is converted too; null: torchtitan's default, false (its ``filter_fqns`` default is
    ``["output"]``)."""


class Train(_Strict):
    """One training step: forward, loss, backward, optimizer step."""

    micro_batch_size: int = Field(1, ge=1, le=1_000_000)
    """Sequences per GPU per forward/backward (the micro-batch, docs/glossary.md)."""

    seq_len: int = Field(2048, ge=1, le=100_000_000)
    """Tokens per sequence."""

    grad_accum_steps: int = Field(1, ge=1, le=1_000_000)
    """Gradient accumulation steps: micro-batches per optimizer step (global batch = micro_batch_size x
    grad_accum_steps x dp sequences)."""

    precision: Precision = "bf16-mixed"
    """Training precision: fp32; autocast mixed precision with fp32 weights (bf16-mixed, fp16-mixed); true half
    precision with no fp32 copy (bf16-true, fp16-true); fp8-mixed as Transformer Engine; fp8-torchao as torchao's
    float8 training (``convert_to_float8_training``, torchtitan's ``float8`` converter), set by ``train.float8``;
    mxfp8-torchao as torchao's MXFP8 training (torchtitan's ``mx`` converter, compute capability 10.0 and up), set by
    ``train.mx``.  NVFP4 training is refused: torchao 0.14.1 and 0.16.0 have none, and Transformer Engine's
    NVFP4BlockScaling (2.8+) runs under Megatron-Core, modelled with --bf16 or fp32 only (facts/mx_training.py).

    Bytes per parameter follow the framework's convention (docs/conventions.md, Model states;
    vramplan.analytic.precision)."""

    trainer_mixed_precision: bool | None = None
    """With half-precision weights (bf16-true, fp16-true) under framework hf-trainer or accelerate with FSDP: whether
    the run also passes the Trainer's ``--bf16``/``--fp16`` (accelerate's ``mixed_precision``), as ``vramplan
    export`` writes it; accelerate 0.30.0 and later then upcast the trainable parameters to fp32, so the run is
    bf16-mixed (fp16-mixed) in memory.

    ``Accelerator.prepare_model`` (accelerate PR #2674, first released in v0.30.0) upcasts every FSDP unit's
    trainable flat parameter that is not fp32 to fp32 "if mixed precision is set" ("Upcasted low precision parameters
    in ... because mixed precision turned on in FSDP"), to hold master weights as DeepSpeed does; FSDP2
    (``fsdp2_prepare_model``) upcasts the trainable parameters the same way.  The gradients and AdamW's moments then
    take fp32 too: 16 B per trainable parameter, sharded, instead of 8.  null: true (the common recipe: a bf16
    checkpoint with ``--bf16``); false: ``mixed_precision: no`` (half weights, gradients and moments).  Other
    frameworks, no FSDP, PEFT (adapters are fp32 from peft 0.12) and fp32/``*-mixed`` precisions ignore it."""

    optimizer: Optimizer = "adamw"
    """Optimizer whose states, and step temporaries, are counted (adamw is torch's foreach AdamW: one
    state-sized temporary in step(); adamw-fused avoids it; docs/conventions.md)."""

    gradient_checkpointing: Checkpointing | None = None
    """Activation recomputation policy: none; full (each checkpointed layer keeps only its input);
    attention-core (only the attention's s x s tensors are dropped); op-sac (torchtitan's op-level selective
    checkpointing); selective means the framework's own: op-sac under torchtitan, attention-core elsewhere.
    null: the trainer's default, full under a TRL objective (dpo, kto, orpo, grpo, rloo: TRL's
    ``gradient_checkpointing=True``, facts/trl.py), none otherwise (the HF Trainer's False).

    attention-core is Megatron's selective recompute (Korthikanti et al., arXiv 2205.05198 sec. 5): with
    sdpa or flash attention it saves what no checkpointing saves.  op-sac saves the outputs of the ops on
    torchtitan's save list, every other matmul of a layer (its 1st, 3rd, ...) and the attention kernel's
    outputs, plus the layer's input, and recomputes the rest (torchtitan/distributed/activation_checkpoint.py
    ``_apply_op_sac``; docs/conventions.md, Activation checkpointing policies)."""

    checkpoint_every_n_layers: int = Field(1, ge=1, le=1_000_000)
    """With full checkpointing, checkpoint every n-th layer only (the n-th, 2n-th, ... counting from 1);
    1 checkpoints every layer.

    torchtitan's ``selective_ac_option: "n"`` (``_apply_layer_sac``: a layer is wrapped when its running
    count is a multiple of n); the other layers save everything.  Frameworks running transformers'
    ``gradient_checkpointing_enable`` checkpoint every layer, so n > 1 is refused for them."""

    deepspeed_checkpointing: DeepSpeedCheckpointing = "none"
    """DeepSpeed's activation checkpointing of the checkpointed layer inputs: partition splits each over the tp
    ranks, partition+cpu keeps the partitions in host memory; needs framework deepspeed and full checkpointing.

    ``deepspeed.checkpointing.configure(partition_activations=..., checkpoint_in_cpu=...)``
    (deepspeed/runtime/activation_checkpointing/checkpointing.py ``partition_activations``: each floating
    input keeps its 1/mp_size slice, on the CPU with ``cpu_checkpoint``; the backward gathers it back).  It acts
    only in models that call ``deepspeed.checkpointing.checkpoint`` (Megatron-DeepSpeed); transformers' models
    checkpoint with torch's ``checkpoint`` and ignore it."""

    attention: Attention = "sdpa"
    """Attention implementation (transformers' attn_implementation): eager saves the s x s scores and the
    softmax; sdpa and flash save none."""

    peft: Peft | None = None
    """Adapters on a frozen base; null trains every parameter (full fine-tuning)."""

    quantization: TrainQuant = "none"
    """Base-weight quantization under training (bitsandbytes int8, 4-bit nf4, nf4 with double quantization,
    fp4); used with QLoRA."""

    loss: LossKernel = "standard"
    """How the LM head and the cross-entropy run: standard (the logits, their fp32 upcast and log_softmax, as
    transformers computes them); liger-fused-linear-ce (Liger-Kernel's fused linear cross-entropy: the logits
    of one chunk of tokens at a time, gradients computed in the forward); cut-cross-entropy (Apple's CCE: only
    the log-sum-exp per token); chunked (torchtune's CEWithChunkedOutputLoss: the head in 8 chunks, each
    upcast to fp32 on its own).

    Sources: Liger-Kernel v0.8.2 ``ops/fused_linear_cross_entropy.py``; ml-cross-entropy 25.6.4
    ``cut_cross_entropy/cce.py``; torchtune v0.6.1 ``modules/loss/ce_chunked_output_loss.py``
    (docs/conventions.md, Fused and chunked losses).  The liger and CCE kernels need triton on a GPU: the
    traced engine refuses them."""

    use_cache: bool | None = None
    """transformers' ``use_cache`` in the training and evaluation forwards; null: the model config's ``use_cache``
    (true in most released configs), which plain loops and the HF Trainer before transformers 5.0 leave as it is;
    the HF Trainer from 5.0 (and the current release) writes ``TrainingArguments.use_cache``, False by default, into
    the config (true here is ``TrainingArguments(use_cache=True)``); LLaMA-Factory, axolotl and Unsloth set it false
    for training; TRL's SFTTrainer passes False from 0.22.  Gradient checkpointing turns it
    off in training, not in evaluation: an evaluation forward (``lifecycle.evaluation``) with it on holds every
    layer's keys and values of its batch to its end.  With it on, transformers builds a ``DynamicCache``
    in the training forward, held by the model output until the loss is returned; the attention runs on the tensors
    it holds, so it adds memory only where the kernel is handed K/V repeated to every query head (eager attention,
    SDPA before 4.54): the grouped keys and values beside the repeated copies; with a fused q/k/v projection what it
    adds or releases is not modelled (docs/conventions.md, The cache in the training forward)."""

    packing: bool = False
    """Sequences packed into each row without padding, run by flash-attention's variable-length kernel from
    position_ids (TRL ``padding_free`` / ``packing``): no attention mask is built; seq_len is the packed
    length.  Needs attention: flash.

    transformers' flash path (``modeling_flash_attention_utils._flash_attention_forward``) reads the sequence
    boundaries from position_ids and calls ``flash_attn_varlen_func``; sdpa and eager would build a 4-D
    block-diagonal mask from them (``masking_utils.find_packed_sequence_indices``), which is not modelled."""

    quantize_moe_experts: bool | None = None
    """QLoRA on a mixture-of-experts model: whether the routed experts are held in the bitsandbytes format too.
    Stock bitsandbytes converts ``nn.Linear`` modules only (transformers ``integrations/bitsandbytes.py``
    ``replace_with_bnb_linear``): transformers 4.x held most families' experts as per-expert ``nn.Linear`` MLPs,
    converted one by one; transformers >= 5 holds them as fused 3-D parameters, and gpt-oss, GraniteMoE, PhiMoE,
    DBRX, Jamba and Qwen3-Next experts are parameters in every release, which stay in the load dtype (bitsandbytes
    issue #1849) and which peft's ``prepare_model_for_kbit_training`` then casts to fp32 with every other
    non-``Params4bit`` half parameter.  ``true``: the experts are 4-bit (axolotl's ``quantize_moe_experts``,
    Unsloth's patch, or transformers 4.x's per-expert layout), estimated; ``false``, or null where stock
    bitsandbytes leaves them unquantized (any transformers >= 5 run): refused, the report naming
    the extra bytes.  Null with transformers 4.x on a family of per-expert linears: quantized, as stock does."""

    liger_kernels: bool = False
    """Liger-Kernel's RMSNorm, SwiGLU and RoPE kernels in place of transformers' (``apply_liger_kernel_to_*``):
    the norms save their input and a per-row rstd only, the SwiGLU saves the gate and up outputs only; RoPE
    saves cos and sin, as transformers' does.  Llama, Mistral, Qwen2 and Qwen3 dense models.

    Liger-Kernel v0.8.2 ``ops/rms_norm.py``, ``ops/swiglu.py``, ``ops/rope.py`` (each function's
    ``ctx.save_for_backward``); docs/conventions.md, Liger kernels."""

    images_per_sample: int = Field(0, ge=0, le=10_000)
    """Images in each sequence (seq_len) of a vision-language model (one with a vision tower, such as gemma3); 0 for
    text only.  seq_len counts every token of the input ids, the image tokens included.

    Each image becomes the model's image tokens in the text (Gemma 3: 256, transformers 5.24
    ``Gemma3Processor.image_seq_length``) and runs through the vision tower (Gemma 3: 4096 patches of
    14 x 14 at 896 x 896, ``SiglipVisionEmbeddings``); docs/models.md, Vision-language models, says what is
    and is not modelled."""

    image_size: int | None = Field(None, ge=1, le=100_000)
    """Side of each (square) image in pixels; null: the model's default.  Gemma 3 resizes every image to
    896 x 896 (the value is ignored); Qwen2.5-VL resizes it to multiples of 28 within its processor's
    min_pixels and max_pixels (``smart_resize``), and null means its largest image (max_pixels).  LLaVA crops
    every image to its tower's resolution (ignored); LLaVA-NeXT cuts it into tiles of its image_grid_pinpoints
    resolution (anyres), and null means the largest square of the grid (672 x 672 by default).

    transformers 5.24 ``models/qwen2_vl/image_processing_qwen2_vl.py`` ``smart_resize``: the tower runs over
    (h / 14) x (w / 14) patches, the merger makes one image token of each 2 x 2."""

    freeze_vision_tower: bool = False
    """Full fine-tuning of a vision-language model with its vision tower and projector frozen: they keep their
    weights but get no gradient, no optimizer state and save no activation.

    TRL's and LLaMA-Factory's ``freeze_vision_tower`` (``requires_grad_(False)`` on the tower); with PEFT the
    tower is frozen anyway.  docs/models.md, Vision-language models."""

    activation_offload: ActivationOffload = "none"
    """Saved activations copied to pinned host memory in the forward and brought back in the backward
    (torchtune's OffloadActivations, TRL's ``activation_offloading``): none, or cpu, with
    gradient_checkpointing: full (the checkpointed layer inputs are what is offloaded, as torchtune's
    recipes require).

    torchtune v0.6.1 ``training/_activation_offloading.py`` (TRL v1.9.0 ``models/activation_offloading.py``
    has the same defaults): the copy runs on a side stream and the GPU tensor stays in a stash until 5 later
    tensors are packed (``max_fwd_stash_size=5``); in the backward a tensor brought back stays until the next
    autograd node's comes (docs/conventions.md, Activation offloading)."""

    torch_compile: bool = False
    """The model compiled with ``torch.compile`` (inductor), as transformers' ``TrainingArguments(torch_compile=
    True)``, torchtitan's ``compile`` and Lightning's ``torch.compile(model)`` do.  Not modelled: the estimate
    counts the eager step (each autograd node's saved tensors); inductor fuses elementwise ops and its min-cut
    partitioner (torch/_functorch/partitioners.py ``min_cut_rematerialization_partition``) chooses what the
    forward saves and recomputes the rest in the backward, so a compiled step usually holds fewer activations
    than the eager one.  Stated as an assumption, and the band widens."""

    optimizer_in_backward: bool = False
    """The optimizer step fused into the backward (torchtune's ``optimizer_in_bwd: True``): one optimizer per
    parameter, stepped by a post-accumulate-grad hook as soon as that parameter's gradient is made, which is
    then freed; so one parameter's gradient and step temporaries are alive at a time instead of all gradients.
    Needs grad_accum_steps 1, no gradient clipping (framework: plain) and one GPU.

    torchtune v0.3.0 ``recipes/full_finetune_single_device.py`` ``_setup_optimizer`` (one optimizer per
    parameter) and ``training/memory.py`` ``register_optim_in_bwd_hooks`` (``p.register_post_accumulate_grad_hook``:
    ``step()`` then ``zero_grad()``); PyTorch's tutorial "How to save memory by fusing the optimizer step into the
    backward pass" (docs/conventions.md, Optimizer in backward)."""

    torchao_cpu_offload: TorchaoOffload = "none"
    """torchao's CPUOffloadOptimizer around the AdamW: optimizer (the states, and a pinned copy of each parameter
    and of its gradient in the parameter's dtype, on the host, the step on the CPU; tensors under 4096 elements
    stay on the GPU with their states), or optimizer+gradients (offload_gradients=True: each GPU gradient freed once copied to the
    host, one at a time; needs grad_accum_steps 1 and no clipping).  Full fine-tuning on one GPU, adamw or
    adamw-fused.

    torchao v0.18.0 ``torchao/optim/cpu_offload.py`` ``CPUOffloadOptimizer`` (``minimal_size=4096``;
    ``torch.empty_like(p, device="cpu", pin_memory=True)`` for the parameter and its gradient; fused CPU AdamW per
    parameter; the gradient copied to the host by a post-accumulate-grad hook); docs/conventions.md, torchao
    CPU-offload optimizer."""
    objective: Objective = "sft"
    """What the step optimizes: sft (next-token cross-entropy, the default), grpo (TRL's GRPOTrainer: a
    policy step on completions sampled by a rollout engine, the ``rl`` section), or dpo (TRL's DPOTrainer:
    ``micro_batch_size`` preference pairs, 2 x micro_batch_size sequences of ``seq_len`` per forward, and the
    reference forward in the step), or kto (TRL v1.16.0's KTOTrainer: ``micro_batch_size`` unpaired examples of
    ``seq_len``, its KL batch and the reference forwards in the step, its fused LM head), or orpo (TRL v1.16.0's
    ORPOTrainer, in trl.experimental: ``micro_batch_size`` pairs as DPO, no reference model), or rloo (TRL v1.16.0's
    RLOOTrainer: modelled as grpo, with RLOOConfig's defaults for the ``rl`` keys left out), or ppo (TRL v1.12.0's
    PPOTrainer, in trl.experimental: the policy and a value model trained together, a reference and a reward model,
    the rollout by the policy's generate; ``micro_batch_size`` is ``per_device_train_batch_size``, docs/rl.md).

    TRL v1.9.0 ``trl/trainer/grpo_trainer.py`` ``GRPOTrainer``; with grpo, ``micro_batch_size`` is TRL's
    ``per_device_train_batch_size``, counted in completions (not prompts), and ``seq_len`` is not read: each
    sequence is ``rl.rollout.max_prompt_len + max_completion_len`` tokens; TRL v1.9.0 ``trl/trainer/dpo_trainer.py``
    ``DPOTrainer`` (docs/rl.md)."""

    float8: Float8Training = Field(default_factory=Float8Training)
    """torchao float8 training settings, read with ``precision: fp8-torchao`` (``Float8Training``)."""

    mx: MXTraining = Field(default_factory=MXTraining)
    """torchao MXFP8 training settings, read with ``precision: mxfp8-torchao`` (``MXTraining``)."""

    source_len: int | None = Field(None, ge=1, le=100_000_000)
    """Source tokens per sample of an encoder-decoder model (T5, BART): the encoder's ``input_ids``; null: seq_len.
    A speech encoder (Whisper) runs over its own positions (1,500 for 30 s of audio): null or that value.
    seq_len is then the target: the decoder's tokens, its ``labels`` (the decoder's inputs are the labels shifted
    right, ``T5ForConditionalGeneration._shift_right`` / ``shift_tokens_right``), over which the loss and the
    logits run.  Ignored for another model.

    Hugging Face's seq2seq examples name them ``max_source_length`` and ``max_target_length``
    (``examples/pytorch/summarization/run_summarization.py``)."""


class AutoAwq(_Strict):
    """AutoAWQ's own fused-module inference (``framework: autoawq``, task inference; docs/lifecycle.md, AutoAWQ)."""

    fuse_layers: bool = True
    """``AutoAWQForCausalLM.from_quantized(fuse_layers=...)``, True in every modelled release; false (transformers'
    modules with AWQ linears) is refused under framework autoawq: estimate it as transformers' generate."""

    max_seq_len: int | None = Field(None, ge=1, le=100_000_000)
    """Positions of the preallocated fused KV cache window (``from_quantized(max_seq_len=...)``; 0.1.x
    ``max_new_tokens=...``); null: the release's default (0.2.x 2048; 0.1.x the config's
    max_position_embeddings).

    AutoAWQ v0.2.3 ``awq/models/auto.py`` ``from_quantized(max_seq_len=2048)``; v0.1.6 ``awq/models/base.py``
    ``_load_config``: ``config.max_new_tokens = getattr(config, self.max_new_tokens_key)`` when None.  A prompt
    longer than the window fails in AutoAWQ (``WindowedCache.update_kv`` cannot write it) and is refused; decode
    steps beyond it roll the window by 100 positions (``roll_kv_n_steps``)."""

    loop: AutoAwqLoop = "forward"
    """How tokens are produced: forward (one ``model(ids)`` call per token, greedy ``argmax`` of the last row, as
    AutoAWQ's ``examples/benchmark.py`` ``generate_torch``), or generate (``model.generate``: transformers'
    generate over the fused model, its last-token logits and sampling warpers)."""

    warmup_matmul: bool = False
    """The measured process ran ``examples/benchmark.py``'s ``warmup``: a 4096 x 4096 fp32 ``torch.randn`` moved to
    the GPU and multiplied by itself (two 64 MiB tensors) after loading.  Benchmark-specific, so off unless asked."""

    load_in_peak: bool = True
    """The measured peak includes ``from_quantized``'s fusing (``torch.cuda.max_memory_allocated`` since the process
    started, as ``examples/benchmark.py`` reads it, without ``reset_peak_memory_stats``); false: the peak was reset
    after loading."""


class Inference(_Strict):
    """Hugging Face generate: the prefill of the prompt, then one decode step per new token."""

    batch_size: int = Field(1, ge=1, le=1_000_000)
    """Sequences generated at once."""

    prompt_len: int = Field(512, ge=1, le=100_000_000)
    """Prompt tokens per sequence (an encoder-decoder model, T5 or BART: the encoder's source tokens; Whisper: not
    read, its encoder's own positions, 1,500 for 30 s of audio, or refused when set to another value)."""

    new_tokens: int = Field(512, ge=0, le=100_000_000)
    """Generated tokens per sequence: the last decode step's cache holds prompt_len + new_tokens - 1 tokens (an
    encoder-decoder model: the decoder's new_tokens, beside the cross-attention cache of the prompt)."""

    dtype: HalfDtype = "bf16"
    """Dtype of the weights and activations."""

    num_beams: int = Field(1, ge=1, le=1024)
    """Beams per sequence (``generate(num_beams=...)``); 1: no beam search.

    Beam search runs every tensor of the call over batch_size x num_beams rows: transformers 5.24
    ``GenerationMixin._expand_inputs_for_generation`` repeats the inputs (and an encoder-decoder model's encoder
    output) num_beams times before the prefill, so the cache, the running layer and the logits are those of
    batch_size x num_beams sequences; ``_beam_search`` adds the beams' token and index buffers and reorders the cache
    after every step (``DynamicLayer.reorder_cache``).  docs/conventions.md, Beam search."""

    quantization: InferQuant = "none"
    """Weight quantization: bitsandbytes int8, nf4, nf4-dq (double quantization), fp4; GPTQ or AWQ 4-bit;
    fp8 (per-channel); fp8-block (e4m3, 128 x 128 tile scales) and mxfp4 (MoE experts), as pre-quantized
    checkpoints store them; gptq-3bit, gptq-8bit (group 128); compressed-tensors ct-w4a16, ct-w8a8-int8, ct-fp8,
    ct-nvfp4, ct-nvfp4a16 (NVFP4 W4A4 and weight-only); Model Optimizer's modelopt-nvfp4 and modelopt-fp8
    (per-tensor); per-tensor fp8: fp8-tensor, fp8-tensor-static (AutoFP8's layout), ct-fp8-tensor,
    ct-fp8-tensor-static; HQQ hqq-4bit, hqq-8bit (group 64); torchao ao-int4 (Int4WeightOnlyConfig, group 128),
    ao-fp8 (Float8DynamicActivationFloat8WeightConfig, per row), ao-int8 (Int8WeightOnlyConfig, per row)."""

    kv_cache_dtype: KVDtype = "auto"
    """Dtype of the KV cache; auto means the model's dtype."""

    attention: Attention = "sdpa"
    """Attention implementation (transformers' attn_implementation); eager keeps the scores."""

    bnb_compute_dtype: HalfDtype | None = None
    """bitsandbytes 4-bit compute dtype (transformers' ``bnb_4bit_compute_dtype``, whose default is fp32);
    null means dtype.

    An fp32 or bf16 dtype overrides it at run time (``Linear4bit.set_compute_type``), so it matters for
    fp16 models only (docs/conventions.md, bitsandbytes' dequantized weights at inference)."""

    images_per_sample: int = Field(0, ge=0, le=10_000)
    """Images in each prompt (prompt_len) of a vision-language model (one with a vision tower, such as gemma3); 0 for
    text only.  prompt_len counts every token of the input ids, the image tokens included.

    Each image becomes the model's image tokens in the text (Gemma 3: 256, transformers 5.24
    ``Gemma3Processor.image_seq_length``) and runs through the vision tower (Gemma 3: 4096 patches of
    14 x 14 at 896 x 896, ``SiglipVisionEmbeddings``); docs/models.md, Vision-language models, says what is
    and is not modelled."""

    image_size: int | None = Field(None, ge=1, le=100_000)
    """Side of each (square) image in pixels; null: the model's default.  Gemma 3 resizes every image to
    896 x 896 (the value is ignored); Qwen2.5-VL resizes it to multiples of 28 within its processor's
    min_pixels and max_pixels (``smart_resize``), and null means its largest image (max_pixels).  LLaVA crops
    every image to its tower's resolution (ignored); LLaVA-NeXT cuts it into tiles of its image_grid_pinpoints
    resolution (anyres), and null means the largest square of the grid (672 x 672 by default).

    transformers 5.24 ``models/qwen2_vl/image_processing_qwen2_vl.py`` ``smart_resize``: the tower runs over
    (h / 14) x (w / 14) patches, the merger makes one image token of each 2 x 2."""

    autoawq: AutoAwq = Field(default_factory=AutoAwq)
    """AutoAWQ's fused inference settings (framework autoawq only)."""


class Speculative(_Strict):
    """Speculative decoding: vLLM's ``--speculative-config`` (a proposer whose weights and KV layers join the
    engine's), or SGLang's ``--speculative-algorithm`` (engine sglang: eagle, eagle3, mtp -- NEXTN --, draft --
    STANDALONE -- or ngram; num_speculative_tokens is --speculative-num-steps, eagle_topk and num_draft_tokens
    --speculative-eagle-topk and --speculative-num-draft-tokens; serve/sglang_options.py)."""

    method: Literal["draft", "eagle", "eagle3", "mtp", "ngram"]
    """Proposer: a draft model, an EAGLE or EAGLE-3 head, the model's MTP layers, or n-gram lookup (no GPU
    weights)."""

    model: str | None = None
    """The draft model or EAGLE head, by catalog name (draft, eagle, eagle3)."""

    num_speculative_tokens: int = Field(1, ge=1, le=64)
    """Tokens proposed per step."""

    eagle_topk: int = Field(1, ge=1, le=64)
    """Draft branches kept per step (SGLang's --speculative-eagle-topk; engine sglang, methods eagle, eagle3, mtp
    and draft): above 1 it needs num_draft_tokens."""

    num_draft_tokens: int | None = Field(None, ge=1, le=1024)
    """Draft tokens verified per request and step (SGLang's --speculative-num-draft-tokens; engine sglang); null:
    num_speculative_tokens + 1 at eagle_topk 1 (SGLang sets it so), 12 for ngram (SGLang's default)."""


# Options one serving engine has and the other does not, with the other engine's option for the same thing
# (vLLM's EngineArgs / SGLang's ServerArgs): a scenario that sets one for the wrong engine is refused.
VLLM_ONLY_OPTIONS: dict[str, str] = {
    "gpu_memory_utilization": "mem_fraction_static", "block_size": "page_size",
    "max_num_seqs": "max_running_requests", "max_num_batched_tokens": "chunked_prefill_size",
    "vllm_version": "sglang_version", "kv_cache_memory_bytes": "", "cpu_offload_gb": "", "max_loras": "",
    "max_lora_rank": "", "vllm_sampler": "", "limit_mm_per_prompt": "", "cudagraph_capture_sizes": "cuda_graph_max_bs",
    "max_cudagraph_capture_size": "cuda_graph_max_bs", "cudagraph_mode": "", "max_cpu_loras": "", "swap_space_gib": "",
    "sleep_level": "", "vllm_engine": "",
}
SGLANG_ONLY_OPTIONS: dict[str, str] = {
    "mem_fraction_static": "gpu_memory_utilization", "page_size": "block_size",
    "max_running_requests": "max_num_seqs", "chunked_prefill_size": "max_num_batched_tokens",
    "sglang_version": "vllm_version", "cuda_graph_max_bs": "", "dp_attention": "",
}


def engine_option_problems(sv: Serve) -> list[tuple[str, str, str]]:
    """(where, what, hint) for each serve option set for an engine that does not have it, the hint naming
    the option that engine uses (checked with the model, ``spec.load.cross_check``).

    An option counts as set when the scenario gives it a value other than its default, so that a scenario
    dumped with every field (``model_dump``) checks again."""
    out = []
    if sv.engine == "llamacpp":
        # neither engine's budget options exist in llama.cpp (it allocates what the model and n_ctx need)
        for table, other in ((VLLM_ONLY_OPTIONS, "vLLM"), (SGLANG_ONLY_OPTIONS, "SGLang")):
            for key in sorted(changed_fields(sv, table)):
                out.append((f"serve.{key}", f"is an option of {other}, not of engine llamacpp",
                            ("remove it; llama.cpp allocates what the model, n_ctx (serve.max_model_len) and "
                            "serve.gguf need, with no budget of its own")))
        if sv.dp > 1:
            # vLLM's --data-parallel-size and SGLang's --dp-size; llama-server has no data-parallel option
            out.append(("serve.dp", ("is an option of vLLM and SGLang (data-parallel engine replicas), not of "
                                     "engine llamacpp"),
                        "remove it (serve.dp 1); several llama-server processes are each one GPU's estimate"))
        if sv.speculative is not None:
            # an option of vLLM and SGLang both; llama-server's draft model (-md) is not modelled
            out.append(("serve.speculative", "is an option of vLLM and SGLang, not of engine llamacpp",
                        "remove it; llama.cpp's draft model (-md) is not modelled"))
        return out
    if sv.engine == "vllm" and sv.speculative is not None:
        for key in sorted(changed_fields(sv.speculative, {"eagle_topk": "", "num_draft_tokens": ""})):
            flag = f"--speculative-{key.replace('_', '-')}"
            out.append((f"serve.speculative.{key}", f"is an option of SGLang ({flag}), not of engine vllm",
                        "remove it; vLLM's proposer takes num_speculative_tokens only"))
    wrong, name = (VLLM_ONLY_OPTIONS, "SGLang") if sv.engine == "sglang" else (SGLANG_ONLY_OPTIONS, "vLLM")
    given = set(changed_fields(sv, wrong))
    for key in sorted(given):
        instead = f"{name} uses serve.{wrong[key]} instead" if wrong[key] else f"{name} has no such option here"
        other = "vLLM" if name == "SGLang" else "SGLang"
        out.append((f"serve.{key}", f"is an option of {other}, not of engine {sv.engine}", f"remove it; {instead}"))
    return out
class Gguf(_Strict):
    """llama.cpp's GGUF model and its context options (``serve.engine: llamacpp`` only)."""

    file: str | None = None
    """A local GGUF file whose header gives the tensors and their types; null: the catalog model as
    ``llama-quantize`` would write it in ``quant``."""

    quant: str = Field("Q4_K_M", min_length=1, max_length=32)
    """The file type (llama-quantize's name: Q4_K_M, Q5_K_M, Q8_0, Q4_0, Q6_K, IQ4_XS, F16 ...) when no file
    is given (facts/gguf.py FILE_TYPES)."""

    n_gpu_layers: int = Field(-1, ge=-1, le=100_000)
    """Layers offloaded to the GPU (-ngl), counted from the last, the output counting as one; -1: all."""

    n_batch: int = Field(2048, ge=1, le=1_000_000)
    """Logical batch (-b): tokens submitted to one decode call."""

    n_ubatch: int = Field(512, ge=1, le=1_000_000)
    """Physical micro-batch (-ub): tokens per graph evaluation; it sizes the compute buffer."""

    n_parallel: int = Field(1, ge=1, le=4096)
    """Sequences served at once (-np, n_seq_max); they share the n_ctx cells of the KV cache."""

    cache_type_k: str = "f16"
    """K cache type (-ctk): f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1."""

    cache_type_v: str = "f16"
    """V cache type (-ctv); a quantized V cache needs flash_attn."""

    flash_attn: bool | None = None
    """Flash attention (-fa): no n_ctx x n_ubatch x n_head score matrix in the compute buffer; null: the
    build's default (off before b6327, auto -- on for a CUDA GPU -- from b6327)."""

    llamacpp_build: str | None = Field(None, max_length=64)
    """llama.cpp build (b3410, 6327 ...) whose start-up rules apply (facts/llamacpp_builds.py); one between two
    modelled builds uses the nearest earlier; null: the newest modelled build."""


class Serve(_Strict):
    """A serving engine after start-up (vLLM, or SGLang with ``engine: sglang``): weights, profiling peak, CUDA
    graphs and the KV block pool."""

    max_model_len: int | None = Field(None, ge=1, le=100_000_000)
    """Max tokens per request (vLLM's max_model_len); null means the model's context length."""

    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """Fraction of the GPU's memory vLLM may use; the KV cache gets what the rest leaves."""

    block_size: int = Field(16, ge=1, le=1024)
    """Tokens per KV cache block (page)."""

    max_num_seqs: int | None = Field(None, ge=1, le=1_000_000)
    """Sequences the scheduler runs at once; null: vllm serve's default for the release and the GPU
    (serve/vllm.py ``default_batch_limits``)."""

    max_num_batched_tokens: int | None = Field(None, ge=1, le=100_000_000)
    """Tokens per scheduler step; null means vllm serve's default for the GPU."""

    kv_cache_dtype: KVDtype = "auto"
    """Dtype of the KV cache; auto means the model's dtype."""

    dtype: ServeDtype = "auto"
    """Dtype of the weights and activations; auto is vllm serve's default --dtype auto, resolved with the GPU: bf16
    (the checkpoint's, assumed bf16: 2 bytes whatever the half dtype) from compute capability 8.0, fp16 below.

    vLLM's ``_get_and_verify_dtype`` (vllm/config.py) takes the checkpoint's torch_dtype (fp16 for an fp32 one); from
    0.9.0 a dtype the GPU lacks falls back to ``current_platform.supported_dtypes[0]``, fp16 below 8.0, with a
    warning; before 0.9.0 ``_check_if_gpu_supports_dtype`` refuses bf16 there, as it refuses an explicit bf16 in
    every release (spec/defaults.py ``served_dtype``)."""

    quantization: InferQuant = "none"
    """Weight quantization: bitsandbytes int8, nf4, nf4-dq (double quantization), fp4; GPTQ or AWQ 4-bit;
    fp8 (per-channel); fp8-block (e4m3, 128 x 128 tile scales) and mxfp4 (MoE experts), as pre-quantized
    checkpoints store them; gptq-3bit, gptq-8bit (group 128); compressed-tensors ct-w4a16, ct-w8a8-int8, ct-fp8,
    ct-nvfp4, ct-nvfp4a16 (NVFP4 W4A4 and weight-only); Model Optimizer's modelopt-nvfp4 and modelopt-fp8
    (per-tensor); per-tensor fp8: fp8-tensor, fp8-tensor-static (AutoFP8's layout), ct-fp8-tensor,
    ct-fp8-tensor-static; HQQ hqq-4bit, hqq-8bit (group 64); torchao ao-int4 (Int4WeightOnlyConfig, group 128),
    ao-fp8 (Float8DynamicActivationFloat8WeightConfig, per row), ao-int8 (Int8WeightOnlyConfig, per row)."""

    cuda_graphs: bool = True
    """vLLM captures CUDA graphs; false is --enforce-eager (no graph memory)."""

    cudagraph_capture_sizes: list[int] | None = None
    """Batch sizes vLLM captures CUDA graphs for (--cudagraph-capture-sizes, CompilationConfig.cudagraph_capture_sizes;
    V1 releases, 0.8 on): the exact list, from 0.12 without the sizes above max_num_batched_tokens; null: the
    release's default list (facts/vllm_cudagraphs.py)."""

    max_cudagraph_capture_size: int | None = Field(None, ge=1, le=1_000_000)
    """Largest batch size vLLM captures (--max-cudagraph-capture-size from 0.12, --cuda-graph-sizes N in
    0.9-0.11): the release's grid up to it; null: the release's default maximum (min(2 x max_num_seqs, 512))."""

    cudagraph_mode: Literal["auto", "NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"] = "auto"
    """vLLM's CUDAGraphMode (--compilation-config '{"cudagraph_mode": ...}', 0.11 on): which graphs are captured;
    auto: the release's default (FULL_AND_PIECEWISE from 0.11); NONE: no graph, the model still compiled."""

    vllm_version: VllmVersion = "0.11"
    """vLLM release modelled, any from 0.6 to 0.33 ("0.11", "0.10.2"); its start-up rules come from
    facts/vllm_releases.py, a release between two modelled rows uses the earlier one (docs/serving.md)."""

    kv_cache_memory_bytes: int | None = Field(None, ge=1, le=1 << 50)
    """An explicit KV cache budget in bytes (vLLM 0.10.2+): gpu_memory_utilization no longer sizes the KV
    cache; null: the utilisation rule."""

    cpu_offload_gb: float = Field(0, ge=0, le=1 << 20)
    """GiB of weights vLLM keeps in host memory and streams to the GPU in each forward pass."""

    max_loras: int = Field(0, ge=0, le=1024)
    """LoRA adapters served at once (vLLM --enable-lora --max-loras); 0: LoRA off."""

    max_lora_rank: int = Field(16, ge=1, le=4096)
    """Largest LoRA rank served (vLLM --max-lora-rank); one of vLLM's allowed ranks."""

    max_cpu_loras: int | None = Field(None, ge=1, le=1_000_000)
    """LoRA adapters vLLM keeps in host memory (--max-cpu-loras), at least max_loras; null: max_loras.  Host
    RAM, bounded by that many adapters of max_lora_rank on every linear (an adapter's own rank is not known)."""

    sleep_level: Literal[0, 1, 2] = 0
    """vLLM sleep mode (--enable-sleep-mode, then llm.sleep(level)): what the engine keeps while it sleeps; 1 moves
    the weights to host RAM and discards the KV cache, 2 discards both (its buffers copied to the host); 0: off.
    Start-up memory is unchanged (V1 releases, read in 0.9.0 and 0.33.0)."""

    swap_space_gib: float | None = Field(None, ge=0, le=1 << 20)
    """GiB of pinned host memory per GPU for preempted KV blocks (vLLM --swap-space; null: vLLM's 4).  The V0
    engine allocates it; V1 allocates none (it recomputes preempted requests); the option is gone from 0.18."""

    speculative: Speculative | None = None
    """Speculative decoding: method, model, num_speculative_tokens; null: off."""

    engine: ServeEngine = "vllm"
    """The serving engine whose start-up is modelled: vllm (default), sglang or llamacpp (docs/serving.md)."""

    sglang_version: str = "0.5.3"
    """SGLang release (engine sglang): any release from 0.4.0 to 0.5.x (read up to 0.5.23); one between two
    modelled behaviours uses the nearest earlier one and says so (serve/sglang.py ``SGLANG_BEHAVIOURS``)."""

    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    """SGLang's share of the memory free at start for weights and the KV pool (engine sglang); null means
    SGLang's default for the release, GPU and tp."""

    page_size: int | None = Field(None, ge=1, le=1024)
    """Tokens per page of SGLang's pool (engine sglang); null means 1, SGLang's default."""

    chunked_prefill_size: int | None = Field(None, ge=1, le=100_000_000)
    """Tokens per prefill chunk (engine sglang); null means SGLang's default for the GPU."""

    cuda_graph_max_bs: int | None = Field(None, ge=1, le=100_000)
    """Largest batch SGLang captures a CUDA graph for (engine sglang); null means its default for the GPU."""

    max_running_requests: int | None = Field(None, ge=1, le=1_000_000)
    """Requests SGLang runs at once (engine sglang); null means its default from the pool size."""
    gguf: Gguf = Field(default_factory=Gguf)
    """llama.cpp's model file and context options (engine llamacpp)."""

    vllm_sampler: Literal["auto", "native", "flashinfer"] = "auto"
    """Top-k/top-p path of vLLM's profile-run sampling: auto is a plain pip install's (PyTorch's sort before 0.24,
    FlashInfer from 0.24); flashinfer as the vllm/vllm-openai image takes it for 0.8-0.11 (flashinfer installed)
    or with VLLM_USE_FLASHINFER_SAMPLER=1; native with VLLM_USE_FLASHINFER_SAMPLER=0 (docs/serving.md)."""

    vllm_engine: Literal["auto", "v0", "v1"] = "auto"
    """vLLM's engine (VLLM_USE_V1): auto is the release's own choice: V0 before 0.8.0, V1 from 0.8.0, except
    that 0.8.0-0.10.1 fall back to V0 on a GPU of compute capability below 8.0, on an fp8 KV cache FlashAttention
    cannot hold, on dtype fp32 before 0.10.0, and in 0.8.x before 0.8.5 also with cpu_offload_gb, bitsandbytes weights,
    LoRA or pipeline parallelism
    (vllm/engine/arg_utils.py _is_v1_supported_oracle, facts/vllm_releases.py V0_FALLBACK_RULES); v0 is
    VLLM_USE_V1=0 (0.8.0-0.10.2; the V0 engine is gone in 0.11.0), v1 VLLM_USE_V1=1 (from 0.8.0; refused where
    vLLM raises instead of falling back).  docs/serving.md, "The V0 fallback"."""

    limit_mm_per_prompt: int | None = Field(None, ge=0, le=1_000_000)
    """Items of each modality (image, video) per prompt (vLLM's --limit-mm-per-prompt, one count for both); it
    sizes the encoder's dummy items of vLLM's profile run (serve/vllm_mm.py); 0 serves text only; null: vLLM's 1."""

    dp: int = Field(1, ge=1, le=1024)
    """Data-parallel engine replicas (vLLM --data-parallel-size, SGLang --dp-size without DP attention), each on its
    own tp x pp GPUs with its own KV pool; the figures stay one GPU's.  vLLM's MoE layers span the dp x tp GPUs:
    experts split over them, or whole experts with parallel.ep = tp x dp (--enable-expert-parallel); 1: off."""

    dp_attention: int = Field(1, ge=1, le=1024)
    """SGLang's DP attention (engine sglang): --enable-dp-attention with --dp-size N; 1: off.  Modelled for
    DeepSeek-V2/V3 and Qwen2/Qwen3-MoE, N dividing parallel.tp (serve/sglang_options.py)."""


class DeepSpeedZero(_Strict):
    """DeepSpeed ZeRO's bucket and live-parameter settings, as the ``zero_optimization`` keys of a DeepSpeed
    config; a null field takes the framework's default (analytic/deepspeed.py ``zero_settings``): DeepSpeed's own
    (deepspeed 0.19.8 runtime/zero/config.py ``DeepSpeedZeroConfig``) under framework deepspeed and lightning, the
    Hugging Face "auto" values under hf-trainer and accelerate (transformers integrations/deepspeed.py
    ``HfTrainerDeepSpeedConfig.trainer_config_finalize``: reduce_bucket_size hidden^2,
    stage3_prefetch_bucket_size 0.9 hidden^2, stage3_param_persistence_threshold 10 hidden)."""

    reduce_bucket_size: int | None = Field(None, ge=1, le=10**13)
    """Elements of gradients reduced at a time: the size of each contiguous gradient bucket (DeepSpeed 5e8)."""

    allgather_bucket_size: int | None = Field(None, ge=0, le=10**13)
    """ZeRO-1/2: elements gathered at a time after the step (DeepSpeed 5e8); unused where torch has
    all_gather_into_tensor (the note says so)."""

    stage3_prefetch_bucket_size: int | None = Field(None, ge=0, le=10**13)
    """ZeRO-3: parameter elements all-gathered ahead of the module that runs (DeepSpeed 5e7)."""

    stage3_max_live_parameters: int | None = Field(None, ge=0, le=10**13)
    """ZeRO-3: gathered elements above which nothing more is prefetched (DeepSpeed 1e9)."""

    stage3_max_reuse_distance: int | None = Field(None, ge=0, le=10**13)
    """ZeRO-3: a module's parameters used again within this many elements of fetched parameters are not
    released (DeepSpeed 1e9)."""

    stage3_param_persistence_threshold: int | None = Field(None, ge=0, le=10**13)
    """ZeRO-3: parameters of at most this many elements stay gathered for the whole run (DeepSpeed 1e5)."""

    contiguous_gradients: bool | None = None
    """Copy each gradient into the preallocated reduce bucket as it is produced (DeepSpeed true)."""

    overlap_comm: bool | None = None
    """Overlap the reduction with the backward: ZeRO-1/2 keep a second reduce bucket (DeepSpeed: true at stage 3,
    else false)."""


class MegatronDdp(_Strict):
    """Megatron-Core's data-parallel settings of a framework megatron run, as Megatron-LM's command-line arguments
    name them (megatron/training/arguments.py at core_v0.15.0); a null field takes Megatron-LM's default."""

    use_distributed_optimizer: bool | None = None
    """Megatron's distributed optimizer (``--use-distributed-optimizer``): the fp32 main parameters and Adam's two
    moments sharded over the data-parallel ranks, the bf16 parameters and the fp32 gradient buffer whole on each
    (``megatron/core/optimizer/distrib_optimizer.py``; the ZeRO-1 layout, 6 + 12/dp bytes per parameter with bf16
    against 18: docs/source/api-guide/dist_optimizer.md).  null: Megatron-LM's default, false (a ``store_true``
    flag, arguments.py line 2658)."""


class Parallel(_Strict):
    """How the job is split over its GPUs (degrees, docs/glossary.md)."""

    zero_stage: Literal[0, 1, 2, 3] = 0
    """DeepSpeed ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also weights over the
    data-parallel degree (arXiv 1910.02054)."""

    fsdp: FSDP = "none"
    """PyTorch FSDP sharding: full_shard is like ZeRO-3, shard_grad_op like ZeRO-2, hybrid_shard shards within
    a node (gpus_per_node), no_shard is data parallel."""

    tp: int = Field(1, ge=1, le=1024)
    """Tensor-parallel degree."""

    pp: int = Field(1, ge=1, le=1024)
    """Pipeline-parallel degree."""

    cp: int = Field(1, ge=1, le=1024)
    """Context-parallel degree: each rank holds seq_len / cp tokens of every sequence (ring attention as torchtitan
    and Megatron-LM run it, or Ulysses sequence parallelism as DeepSpeed, ms-swift and accelerate's ``sp_size`` run
    it: the same bytes); the cp ranks join the data-parallel ones in ZeRO / FSDP sharding (dp x cp ranks)."""

    ep: int = Field(1, ge=1, le=1024)
    """Expert-parallel degree (mixture-of-experts models)."""

    moe_expert_capacity_factor: float | None = Field(None, ge=1, le=64)
    """Expert capacity factor f (Megatron-LM ``moe_expert_capacity_factor``, DeepSpeed-MoE ``capacity_factor``):
    each expert takes at most C = ceil(T x top_k x f / experts) of a rank's T routed tokens, so a rank's experts
    hold at most experts x min(C, T) routed rows (analytic/moe_capacity.py); null: dropless, routing perfectly
    balanced (T x top_k rows)."""

    moe_pad_to_capacity: bool = False
    """Pad every expert's input to its capacity (Megatron-LM ``moe_pad_expert_input_to_capacity``): the rows are
    exactly experts x min(C, T); needs moe_expert_capacity_factor."""

    sequence_parallel: bool = False
    """Megatron sequence parallelism with tp: the norm and residual tensors are split over the tp ranks too
    (arXiv 2205.05198 sec. 4.2.2)."""

    offload: Offload = "none"
    """Keep optimizer states (and for optimizer+params, weights) in host or NVMe memory; needs ZeRO or FSDP,
    parameters at ZeRO-3."""

    offload_device: OffloadDevice = "cpu"
    """Where offloaded optimizer states are kept: cpu (host RAM) or nvme."""

    pp_schedule: PipelineScheduleName = "1f1b"
    """Pipeline schedule with pp > 1 (facts/pipeline_schedules.py): 1f1b, gpipe (every micro-batch of the step in
    flight), interleaved-1f1b (pp_virtual_stages model chunks per rank), interleaved-zero-bubble (ZB1P: split
    backward, each chunk's saved tensors and op gradients held until its weight pass), zbv-zero-bubble (ZB-V) and
    dualpipev (2 chunks per rank laid out V-shaped: rank r holds stages r and 2 pp - 1 - r, rank 0 the embedding
    and the head; dualpipev needs grad_accum_steps >= 2 pp)."""

    pp_virtual_stages: int = Field(1, ge=1, le=64)
    """Model chunks per pipeline rank (virtual stages) of a multi-stage schedule: rank r holds chunks r, r + pp, ...
    of layers / (pp x pp_virtual_stages) layers each (zbv-zero-bubble and dualpipev: 2, chunks r and
    2 pp - 1 - r); 1 for 1f1b and gpipe."""

    deepspeed: DeepSpeedZero | None = None
    """DeepSpeed ZeRO's bucket and live-parameter settings (zero_stage 1-3 without fsdp); null: the framework's
    defaults for every one."""

    megatron: MegatronDdp | None = None
    """Megatron-Core's data-parallel settings (framework megatron); null: Megatron-LM's defaults for every one."""


class Lifecycle(_Strict):
    """The job around its steady training step: loading, PEFT preparation, evaluation, checkpoint saving.

    Each phase's peak is reported beside the step's (docs/lifecycle.md); null fields take the framework's
    default, stated in the report's assumptions."""

    load_dtype: LoadDtype = "auto"
    """Dtype from_pretrained loads the weights in: auto is the dtype the step holds them in; fp32 loads fp32
    onto the GPU and casts afterwards.

    fp32 is transformers' default before 5.0 when the script passes no torch_dtype
    (``PreTrainedModel.from_pretrained``: ``torch.get_default_dtype()``); PR huggingface/transformers#42805
    made dtype="auto" the default, released in 5.0.  The cast (``Module.to``, one parameter at a time)
    leaves the fp32 blocks cached (analytic/lifecycle/load.py)."""

    device_map: DeviceMap | None = None
    """Where from_pretrained materializes the weights: auto loads them onto the GPU tensor by tensor (host RAM:
    one checkpoint shard); none builds the model in host RAM, then it is moved; null: auto with bitsandbytes,
    else none.

    A bitsandbytes model given no device map gets ``{"": torch.cuda.current_device()}``
    (transformers ``Bnb4BitHfQuantizer.update_device_map``, quantizers/quantizer_bnb_4bit.py, 4.38-4.57), so a
    quantized base always loads onto the GPU."""

    evaluation: bool | None = None
    """The job evaluates on a validation set while it trains; null: the framework's default (Lit-GPT's finetune
    scripts validate, the HF Trainer does not: ``eval_strategy="no"``)."""

    eval_batch_size: int | None = Field(None, ge=1, le=1_000_000)
    """Sequences per evaluation batch per GPU; null: the framework's default (HF Trainer
    ``per_device_eval_batch_size=8``; Lit-GPT the training micro-batch)."""

    eval_keeps_logits: bool = False
    """The evaluation loop keeps every batch's logits on the GPU (HF Trainer with a ``compute_metrics``;
    without one ``Trainer.evaluate`` passes ``prediction_loss_only=True`` and keeps none)."""

    eval_batches: int = Field(1, ge=1, le=100_000_000)
    """Evaluation batches per evaluation; with eval_keeps_logits, how many batches of logits pile up."""

    eval_accumulation_steps: int | None = Field(None, ge=1, le=100_000_000)
    """HF Trainer ``eval_accumulation_steps``: kept logits move to the CPU every this many batches; null keeps
    them all on the GPU until the loop ends."""

    eval_seq_len: int | None = Field(None, ge=1, le=10_000_000)
    """Tokens per evaluation sequence (the longest in an evaluation batch, to which the collator pads it);
    null: the training seq_len.

    Validation sets are often longer than the training crop (whole documents, long prompts with their answers)
    or shorter (short-answer benchmarks); the evaluation forward's logits and MLP tensors, and the logits an HF
    Trainer with a ``compute_metrics`` keeps, scale with it (``DataCollatorWithPadding`` pads each batch to its
    longest sample; ``nested_concat`` pads kept logits to the longest batch)."""

    eval_generate_tokens: int | None = Field(None, ge=0, le=100_000_000)
    """Tokens generated from one sample after each validation (Lit-GPT's ``generate_example``); null: Lit-GPT's
    ``EvalArgs.max_new_tokens=100`` under lightning, none elsewhere."""

    checkpoint_save: bool = True
    """The job saves a checkpoint while it runs (the HF Trainer's ``save_strategy="steps"`` and Lit-GPT save by
    default)."""

    state_dict_type: StateDictType | None = None
    """How a sharded (FSDP or ZeRO-3) model is saved: full gathers the whole model on every GPU (FSDP
    FULL_STATE_DICT without offload_to_cpu); full_offload gathers one unit at a time to the CPU (rank0_only);
    sharded saves each rank's shard; null: full_offload (accelerate's and Lightning's FULL_STATE_DICT
    config), sharded under torchtitan (DCP) and DeepSpeed (``save_checkpoint``).

    DeepSpeed with ``stage3_gather_16bit_weights_on_model_save`` is full_offload: each module's parameters
    are gathered in turn (``DeepSpeedEngine._zero3_consolidated_16bit_state_dict``)."""

    save_optimizer: bool = True
    """The saved checkpoint holds the optimizer's state too (the HF Trainer's checkpoints unless
    save_only_model=True, Lightning's); false for a model-only save (the Trainer's final save_model).

    Under state_dict_type full the optimizer's full state dict is gathered on the GPU after the model's
    (FSDP ``FullOptimStateDictConfig`` defaults to ``offload_to_cpu=False``; analytic/lifecycle/save.py)."""

    zero_init: bool | None = None
    """DeepSpeed ZeRO-3 builds the model partitioned (``deepspeed.zero.Init``: each parameter partitioned as it is
    made, the checkpoint then loaded module by module under ``GatheredParameters``); null: true, as the scripts of the
    HF Trainer, TRL, LLaMA-Factory and DeepSpeed-Chat do (they make the DeepSpeed config, ``TrainingArguments`` or
    ``HfDeepSpeedConfig``, before ``from_pretrained``, which then builds under zero.Init: transformers
    ``is_deepspeed_zero3_enabled``).

    false: the model was built before the DeepSpeed config existed (``from_pretrained`` called before
    ``TrainingArguments``, or a model built in plain PyTorch and handed to ``deepspeed.initialize``).
    ``deepspeed.initialize`` then casts it to the half dtype and moves it to the GPU whole
    (``DeepSpeedEngine._configure_distributed_model``: ``module.to(self.device)`` unless the model is a zero.Init
    one, deepspeed v0.9-0.19.8) and partitions it there (``DeepSpeedZeRoOffload._convert_to_zero_parameters`` ->
    ``zero.Init(module=...)``: each parameter's partition made, then its whole tensor freed): the load peaks at the
    whole half model (analytic/lifecycle/load.py, mode whole-partition).  The freed blocks do not stay: ZeRO-3's
    optimizer then moves the partitions into one flat buffer through host memory and empties the cache on the way
    (runtime/zero/utils.py ``defragment``: ``empty_cache()``), so the step starts from an empty cache either way."""

    quantize_at_init: bool | None = None
    """The quantized linears are made on the GPU and quantized as they are built, then quantized again from the
    checkpoint one linear at a time; null: on under lightning with a bitsandbytes 4-bit format (Lit-GPT).

    Lit-GPT builds its model under ``fabric.init_module`` with Lightning's ``BitsandbytesPrecision``, whose
    ``_Linear4bit`` quantizes in its constructor and again in a ``load_state_dict`` pre-hook (lit-gpt 8641822
    ``finetune/lora.py``, lightning 71aed75 ``plugins/precision/bitsandbytes.py``); false: each linear arrives
    once as a half-precision copy and is quantized there (analytic/lifecycle/load.py)."""


def _version(text: str | None) -> tuple[int, ...] | None:
    """A release string as a comparable tuple: "4.43.2" -> (4, 43, 2); None stays None."""
    return None if text is None else tuple(int(x) for x in text.split("."))


class Software(_Strict):
    """Library versions whose memory behaviour differs; None means the current release's behaviour."""

    bitsandbytes: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """bitsandbytes release of the run, e.g. 0.41.1; before 0.43.2 each 4-bit linear keeps its input.

    bitsandbytes before 0.43.2 kept every 4-bit linear's input for the backward (MatMul4Bit:
    ctx.tensors = (A, B)); PR bitsandbytes-foundation/bitsandbytes#1270 (July 2024) dropped it."""

    peft: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """peft release of the run, e.g. 0.10.0; before 0.12 adapters take their base weight's dtype.

    peft before 0.12 gave each new LoRA adapter its base weight's floating dtype (LoraLayer.update_layer:
    ``self.to(weight.device, dtype=weight.dtype)`` when the weight is a float); PR huggingface/peft#1706
    (merged May 2024, after the 0.11 releases: PR #1874 says so) made get_peft_model upcast fp16/bf16
    adapters to fp32 (``autocast_adapter_dtype=True``), released in 0.12.0."""

    accelerate: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """accelerate release of an hf-trainer or accelerate run, e.g. 0.28.0; from 0.30 FSDP with mixed precision
    upcasts half-precision trainable parameters to fp32 (``train.trainer_mixed_precision``).  None: a release from
    0.30 on (the report says so)."""

    @property
    def accelerate_version(self) -> tuple[int, ...] | None:
        return _version(self.accelerate)

    transformers: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """transformers release of the run, e.g. 4.46; before 5 MoE experts are per-expert linears, generate
    before 4.42 keeps two caches and before 4.45 the logits of every prompt position.

    transformers 5 fuses a MoE layer's routed experts into two 3-D parameters (``gate_up_proj``
    [E, 2I, h] and ``down_proj`` [E, h, I], conversion_mapping.py) where 4.x held one ``nn.Linear`` MLP
    per expert; LoRA on the experts then goes through peft's ``ParamWrapper`` instead of per-expert
    ``lora.Linear`` layers (analytic/layout.py ``lora_targets``).  Hugging Face ``generate`` before 4.42
    kept the previous step's cache alive while building the next one, and before 4.45 computed the logits
    of every prompt position (analytic/inference.py ``GenerateBehaviour``).  A release older than the
    model's family (its first release, facts/data/transformers_model_types.json) is refused."""

    torch: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """PyTorch release of the run, e.g. 2.11; before 2.14 SDPA's memory-efficient kernel refuses grouped K/V.

    PyTorch's memory-efficient attention takes grouped-query K/V (``enable_gqa=True``) from 2.14 (its
    ``scaled_dot_product_attention`` docstring: 2.13 "works only for Flash_attention and math kernel",
    2.14 "Memory-efficient attention also supports GQA on NVIDIA CUDA"; pytorch/pytorch#191085).
    transformers >= 4.54 passes ``enable_gqa=True`` when there is no mask (``use_gqa_in_sdpa``), so where
    flash cannot run (fp32, a GPU before sm80, head_dim > 256) a GQA model's attention runs SDPA's
    math kernel, which saves the s x s softmax, on torch <= 2.13.  None: the engines assume a release
    before 2.14, the one every published measurement to date ran (the report says so)."""

    trl: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """TRL release of a post-training run (dpo, grpo) or of an SFTTrainer run (objective sft under the HF Trainer),
    e.g. 1.16.0; from 1.15 their log-probs take TRL's fused head.

    SFTTrainer (analytic/trl_sft.py, facts/trl.py ``SFT_LOSS_ROWS``): 0.15-1.6 copy the shifted logits for the token
    accuracy after the loss (two copies in 1.3-1.5, gathered over the ranks in 0.15.0, the entropy per sequence in
    0.22), 1.7-1.14 compute ``chunked_nll`` (the head in chunks of 256 positions, no logits), 1.15 on the fused head.
    Unset: an SFT step is the HF Trainer's; leave it unset for trainers built on the HF Trainer alone (Axolotl's
    AxolotlTrainer, LLaMA-Factory's CustomSeq2SeqTrainer), whose loss is the HF Trainer's whatever TRL is installed.

    TRL 1.15.0 patches DPOTrainer's and GRPOTrainer's models with ``add_fused_lm_head`` (``trl/trainer/utils.py``),
    which never makes the ``(batch, seq_len, vocab)`` logits; 1.9-1.13 compute ``selective_log_softmax`` over the
    model's logits; 1.14 runs TRL's Triton log-prob kernel over them (refused: not modelled); earlier releases are
    refused for DPO; GRPO is modelled from 0.15.0 (facts/trl.py ``GRPO_EARLY_ROWS``: 0.16-0.29 divide the logits by
    the temperature out of place; GRPOConfig's beta 0.04 before 0.19 and gradient checkpointing off before 0.22; no
    colocated vLLM before 0.18), 0.14.x refused.  None: DPO and GRPO as TRL v1.9.0 (their reports before this key), KTO and ORPO as
    v1.16.0, the releases each module was read at (the report names it).  PPO: v1.12.0 only (trl.experimental.ppo,
    removed in 1.13.0; facts/trl.py ``PPO_ROWS``), also when None."""

    unsloth: str | None = Field(None, pattern=r"^20\d\d\.\d{1,2}(\.\d+)?$")
    """Unsloth release of a LoRA/QLoRA run whose model Unsloth's ``FastLanguageModel`` patched, e.g. 2024.5 or
    2025.4.1 (its ``__version__``), under the HF Trainer (TRL's SFTTrainer); null: no Unsloth.

    Unsloth replaces the causal LM's forward, so the loss is its own (analytic/unsloth.py, facts/unsloth.py
    ``UNSLOTH_ROWS``, by release and family): the logits in the model's dtype and its Triton cross-entropy, which
    keeps them and writes their gradient in place (accelerate's fp32 copy of the returned logits under autocast);
    Apple's Cut Cross-Entropy where it runs (torch >= 2.4, compute capability >= 7.5) from 2024.11.8 (above 1,024
    tokens per micro-batch from 2024.12.5; Mistral's forward from 2025.3.1); from 2025.8.5 refused (a fused loss
    sized from the free memory at run time).  Its own k-bit preparation casts only the LoRA weights to fp32 (PEFT's
    casts every non-quantized parameter).  ``use_gradient_checkpointing="unsloth"`` (from 2024.4) is
    ``gradient_checkpointing: full`` with ``activation_offload: cpu``; ``True`` is ``full`` alone.  Its attention is
    its own (flash-attn, else xformers; Gemma 2 without flash-attn the whole score matrix), which replaces
    ``train.attention`` (said so).  Llama and Mistral, Gemma (2024.2), Qwen2 (2024.5), Gemma 2 (2024.7) and Qwen3
    (2025.4.2) models, one GPU, LoRA/QLoRA with an NF4 base."""

    autoawq: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """AutoAWQ release of a framework autoawq run, e.g. 0.1.6; 0.1.6-0.2.3 are modelled, null: 0.2.3.

    The releases differ in the cache window's argument and default, the MLP and the GEMM kernel
    (facts/autoawq.py, read at each tag of github.com/casper-hansen/AutoAWQ)."""

    expandable_segments: bool | None = None
    """Whether the training processes run with ``PYTORCH_CUDA_ALLOC_CONF`` (``PYTORCH_ALLOC_CONF``)
    ``expandable_segments:True``, which grows one segment per stream instead of caching separate blocks, so the
    reserved memory of a training step stays close to its allocated peak (the allocator replay, docs/allocator.md).
    null: the launcher's default: true under framework torchtitan, whose ``run_train.sh`` sets it (pytorch/torchtitan
    PR #643, 2024-10-22, in every tagged release), false otherwise (PyTorch's default); set false for a torchtitan
    run launched before that or without the script.  Read by the training step's replay."""

    torchtune: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """torchtune release of a framework torchtune run, e.g. 0.2.1; before 0.3 the recipes copy the shifted fp32 logits.

    torchtune before v0.3.0 returned ``self.output(h).float()`` from ``TransformerDecoder.forward`` and its
    recipes copied the shifted logits (``logits[..., :-1, :].contiguous()``) for ``nn.CrossEntropyLoss``; from
    v0.3.0 they shift the labels instead (``torch.hstack`` with the ignore index) and the configs name
    ``CEWithChunkedOutputLoss`` (``train.loss: chunked``).  null: v0.6.1 (docs/conventions.md, torchtune)."""

    @property
    def torchtune_version(self) -> tuple[int, ...] | None:
        return _version(self.torchtune)

    torchtitan: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """torchtitan release of a framework torchtitan run, e.g. 0.2.0; from 0.2 the embedding and the head are FSDP units.

    Up to v0.1.0 ``apply_fsdp`` wrapped each TransformerBlock (the last not resharded after forward) and then the
    model, whose root unit held the embedding, the final norm and the head, gathered through the forward and the
    backward (parallelize_llama.py at commit 9dec370); from v0.2.0 (commit 83e6941, July 2025) the embedding is a
    unit resharded after forward and ``[norm, output]`` one kept from its forward to its backward, every block
    resharded (an untied model; a tied one keeps the three in one unit, as before).  None: the v0.1 layout, the one
    the published torchtitan measurements ran (analytic/terms/sharding.py; the report says so).  ``--export`` writes
    torchtitan.toml in this release's job-config layout (facts/torchtitan_releases.py: 0.1.0, 0.2.0, 0.2.1, 0.2.2;
    None: 0.2.2, the newest read; another release is refused)."""

    @property
    def torchtitan_split_units(self) -> bool:
        """True for torchtitan >= 0.2: the embedding and ``[norm, output]`` are FSDP units of their own."""
        v = _version(self.torchtitan)
        return v is not None and v >= (0, 2)

    @property
    def trl_version(self) -> tuple[int, ...] | None:
        return _version(self.trl)

    @property
    def unsloth_version(self) -> tuple[int, ...] | None:
        return _version(self.unsloth)

    @property
    def torch_version(self) -> tuple[int, ...] | None:
        return _version(self.torch)

    deepspeed: str | None = Field(None, pattern=r"^\d+(\.\d+){0,2}$")
    """DeepSpeed release of a ZeRO run, e.g. 0.14.4; before 0.19.6 ZeRO-1/2's overflow check copies each gradient.

    ZeRO-1/2's ``_has_inf_or_nan`` (runtime/zero/stage_1_and_2.py) made an fp32 copy and three boolean masks of
    the gradient and a float copy of the last (11 B per element of a half gradient) up to 0.19.5; 0.19.6 reduces
    with ``amax``/``amin`` instead (runtime/utils.py ``has_inf_or_nan``: "nothing proportional to x is
    allocated").  With the optimizer offloaded it runs on every gradient in the backward; without, in the step
    for fp16 (and for every dtype before 0.11.2, PR deepspeedai/DeepSpeed#4512).  None: a release from 0.11.2 to
    0.19.5, the ones the published measurements ran (the report says so when it matters)."""

    @property
    def deepspeed_version(self) -> tuple[int, ...] | None:
        return _version(self.deepspeed)

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


class Rollout(_Strict):
    """The engine that samples the completions of an RL step (train.objective: grpo)."""

    engine: RolloutEngine | None = None
    """Who generates: vllm (TRL ``use_vllm=True``), or hf-generate (the policy's ``model.generate`` in the trainer).

    TRL v1.9.0 ``GRPOConfig.use_vllm`` (default False: the estimate asks for the engine by name); hf-generate:
    ``_generate_single_turn`` under ``unwrap_model_for_generation`` (analytic/lifecycle/hf_rollout.py).

    null: hf-generate under ``train.objective: ppo`` (PPOTrainer has no vLLM path), vllm otherwise
    (spec/defaults.py ``rollout_engine``)."""

    colocate: bool = True
    """vLLM inside the training process on the same GPUs (TRL ``vllm_mode="colocate"``, its default), or a
    separate server on other GPUs (``vllm_mode="server"``: no rollout memory on the training GPUs).

    TRL v1.9.0 ``GRPOConfig.vllm_mode``; ``trl/generation/vllm_generation.py`` ``VLLMGeneration``."""

    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """Share of the GPU's total memory the colocated vLLM engine requests for its weights, profile peak and
    KV cache (TRL ``vllm_gpu_memory_utilization``, default 0.3).

    TRL v1.9.0 ``GRPOConfig.vllm_gpu_memory_utilization``, passed to ``vllm.LLM(gpu_memory_utilization=...)``
    by ``VLLMGeneration``; vLLM sizes its KV cache from it as when serving (serve/vllm.py)."""

    sleep_mode: Literal[0, 1, 2] = 0
    """vLLM sleep mode between rollouts: 0 off (TRL ``vllm_enable_sleep_mode=False``, the default); 2 is what
    TRL does when it is on (``llm.sleep(level=2)``: weights and KV cache discarded, weights reloaded from the
    policy at the next sync); 1 offloads the weights to host memory and discards the KV cache.

    TRL v1.9.0 ``trl/generation/vllm_generation.py`` (``self.llm.sleep(level=2)`` after each generate,
    ``wake_up(tags=["weights"])`` in ``sync_weights``, ``wake_up(tags=["kv_cache"])`` before generate)."""

    num_generations: int | None = Field(None, ge=2, le=1_000_000)
    """Completions sampled per prompt (TRL ``num_generations``, default 8; RLOO's 2): the group of the group-relative
    advantage.  micro_batch_size x data-parallel ranks x grad_accum_steps must be a multiple of it.

    null: the trainer's default, RLOOConfig's 2 under ``train.objective: rloo`` (TRL v1.16.0, which requires at
    least 2), else GRPOConfig's 8 (spec/defaults.py)."""

    max_prompt_len: int = Field(512, ge=1, le=100_000_000)
    """Longest prompt, in tokens (TRL < 1.0 ``max_prompt_length``, default 512; TRL >= 1.0 no longer truncates
    prompts, so give the dataset's longest)."""

    max_completion_len: int | None = Field(None, ge=1, le=100_000_000)
    """Longest completion, in tokens (TRL ``max_completion_length``): the policy's logits and log-probabilities are
    computed over these positions only (``logits_to_keep``).

    null: the trainer's default at the release: ``GRPOConfig``'s 256 at TRL v1.9.0 and 512 from v1.10.0
    (``software.trl``, facts/trl.py); RLOOConfig's 512 under ``train.objective: rloo``."""

    vllm_version: VllmVersion = "0.11"
    """vLLM release of the colocated engine (its start-up rules, facts/vllm_releases.py)."""


class Verl(_Strict):
    """verl's hybrid-engine settings (``framework: verl``, train.objective grpo): its own config names
    (``actor_rollout_ref.*``); a null field takes verl's default at ``release`` (facts/verl.py, with each default's
    file and line).  ``train.micro_batch_size`` is ``actor.ppo_micro_batch_size_per_gpu``,
    ``train.gradient_checkpointing`` null is ``model.enable_gradient_checkpointing: true``,
    ``rl.rollout.max_prompt_len`` / ``max_completion_len`` are ``data.max_prompt_length`` / ``max_response_length``
    (null: 512), ``rl.reference_model: separate`` is ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``
    (null: none, verl's default), and ``rl.rollout.vllm_version`` the vLLM release (docs/rl.md, verl)."""

    release: Literal["0.4.1", "0.5.0"] | None = None
    """verl release whose defaults and code are followed (0.4.1 and 0.5.0 read); null: 0.5.0."""

    param_offload: bool | None = None
    """``actor.fsdp_config.param_offload``: the actor's FSDP shards in host memory outside its weight sync, log-prob
    and update phases (``offload_fsdp_model_to_cpu``); null: false."""

    optimizer_offload: bool | None = None
    """``actor.fsdp_config.optimizer_offload``: the AdamW states in host memory outside the actor update
    (``offload_fsdp_optimizer``); null: false."""

    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """``rollout.gpu_memory_utilization``, passed to ``vllm.LLM`` unchanged: vLLM's own meaning at
    ``rl.rollout.vllm_version`` (from 0.9.1 the share of the GPU's total memory the engine's own usage may reach,
    serve/vllm.py); null: 0.5."""

    tensor_model_parallel_size: int | None = Field(None, ge=1, le=1024)
    """``rollout.tensor_model_parallel_size``: the engine's weights and KV cache split over this many GPUs; null: 2."""

    free_cache_engine: bool | None = None
    """``rollout.free_cache_engine``: the engine sleeps (level 1: weights to host memory, KV cache freed) after each
    rollout; false (v0.5.0 only) keeps it awake in every phase; null: true."""

    enforce_eager: bool | None = None
    """``rollout.enforce_eager``: no CUDA graphs (verl asserts it when free_cache_engine is on); null: true."""

    log_prob_micro_batch_size_per_gpu: int | None = Field(None, ge=1, le=1_000_000)
    """``rollout.log_prob_micro_batch_size_per_gpu``: sequences per no-grad forward of the old log-probabilities
    (and of the reference's unless ``ref_log_prob_micro_batch_size_per_gpu``); null is refused, as verl refuses it
    without dynamic batching (``check_mutually_exclusive``)."""

    ref_log_prob_micro_batch_size_per_gpu: int | None = Field(None, ge=1, le=1_000_000)
    """``ref.log_prob_micro_batch_size_per_gpu``: sequences per forward of the reference's log-probabilities; null is
    refused with ``rl.reference_model: separate``, as verl refuses it without dynamic batching."""

    use_dynamic_bsz: bool = False
    """``actor.use_dynamic_bsz`` (micro-batches packed up to ``ppo_max_token_len_per_gpu`` tokens): true is refused
    (not modelled)."""

    use_remove_padding: bool | None = None
    """``model.use_remove_padding`` (unpadded tokens, flash-attn varlen): true is refused (not modelled); null: false."""

    entropy_coeff: float | None = Field(None, ge=0, le=1_000_000, allow_inf_nan=False)
    """``actor.entropy_coeff``: non-zero (the entropy in the update's graph) is refused (not modelled); null: 0."""

    strategy: Literal["fsdp", "fsdp2", "megatron"] | None = None
    """``actor.strategy``: fsdp (FSDP1) is modelled; fsdp2 and megatron are refused (not modelled); null: fsdp."""

    rollout_name: Literal["vllm", "sglang", "hf"] | None = None
    """``rollout.name``: vllm is modelled; sglang and hf are refused (not modelled); null: vllm."""


class OpenRlhf(_Strict):
    """OpenRLHF's Ray layout (``framework: openrlhf``; train.objective grpo: a critic-free advantage estimator,
    train.objective ppo: gae with a critic): its own option names (``openrlhf/cli/train_ppo_ray.py``); a null field
    takes OpenRLHF's default at ``release`` (facts/openrlhf.py, with each default's line).  ``hardware.num_gpus`` is
    the actor's GPUs (``actor_num_nodes x actor_num_gpus_per_node``; the critic's and the reward model's groups are
    taken as as many), ``train.gradient_checkpointing`` null is ``--gradient_checkpointing``'s false,
    ``rl.reference_model`` null or separate is ``--init_kl_coef`` above 0 (OpenRLHF's 0.01) and none is 0,
    ``rl.reward_model`` null is ``--remote_rm_url`` (no reward model on the GPUs) and the model's id is
    ``--reward_pretrain``, ``rl.value_model`` the ``--critic_pretrain``, and ``rl.rollout.vllm_version`` the vLLM
    release (docs/rl.md, OpenRLHF)."""

    release: Literal["0.8.11"] | None = None
    """OpenRLHF release whose defaults and code are followed (0.8.11 read); null: 0.8.11."""

    advantage_estimator: Literal["gae", "reinforce", "rloo", "reinforce_baseline", "group_norm",
                                 "dr_grpo"] | None = None
    """``--advantage_estimator``: the critic-free ones (group_norm, dr_grpo, rloo, reinforce, reinforce_baseline)
    under train.objective grpo (they differ in the advantages' arithmetic on a few numbers per sequence), gae
    (OpenRLHF's default: PPO with a critic model, ``CriticModelActor``) under train.objective ppo; null: group_norm
    under grpo, gae under ppo."""

    zero_stage: Literal[0, 1, 2, 3] | None = None
    """``--zero_stage``: the actor's DeepSpeed ZeRO stage; the reference runs stage 3 when it is 3, else a whole
    copy (stage 0); null: 2."""

    bf16: bool | None = None
    """``--bf16``: the models loaded in bf16 and DeepSpeed's bf16 mode; false (fp32 models and training) is refused
    (not modelled); null: OpenRLHF's false, refused: set true."""

    adam_offload: bool | None = None
    """``--adam_offload``: the actor's Adam states in host memory (DeepSpeedCPUAdam, ZeRO offload_optimizer cpu);
    null: false."""

    colocate_all_models: bool | None = None
    """``--colocate_all_models``: the actor, the reference and the vLLM engines on the same GPUs (requires
    vllm_num_engines x vllm_tensor_parallel_size = hardware.num_gpus); null: false."""

    colocate_actor_ref: bool | None = None
    """``--colocate_actor_ref``: the reference on the actor's GPUs; null: false (its own GPUs)."""

    colocate_critic_reward: bool | None = None
    """``--colocate_critic_reward``: the critic and the reward model on the same GPUs of their own (read with a
    critic and without colocate_all_models, which puts both on the actor's GPUs); null: false."""

    ref_reward_offload: bool | None = None
    """``--ref_reward_offload``: the reference's and the reward model's parameters in host memory (ZeRO-3
    offload_param: with zero_stage 3 only, refused below); null: false."""

    deepspeed_enable_sleep: bool | None = None
    """``--deepspeed_enable_sleep``: the actor's (and the critic's) optimizer states, fp32 master and gradient
    buffers in host memory outside its training step (offload_deepspeed_states); null: false."""

    vllm_num_engines: int | None = Field(None, ge=0, le=1_000_000)
    """``--vllm_num_engines``: vLLM engines generating the rollouts; null or 0 (OpenRLHF's default: no engine) is
    refused (generation without vLLM is not modelled)."""

    vllm_tensor_parallel_size: int | None = Field(None, ge=1, le=1024)
    """``--vllm_tensor_parallel_size``: each engine's weights and KV cache split over this many GPUs; null: 1."""

    vllm_gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """``--vllm_gpu_memory_utilization``, passed to ``vllm.LLM`` unchanged (vLLM's meaning at
    ``rl.rollout.vllm_version``); null: 0.95."""

    vllm_enable_sleep: bool | None = None
    """``--vllm_enable_sleep``: the engines asleep (level 1: weights to host memory, KV cache freed) outside the
    generation and the weight sync; read only with colocate_all_models (OpenRLHF resets it otherwise); null: false."""

    enforce_eager: bool | None = None
    """``--enforce_eager``: no CUDA graphs in vLLM; null: false."""

    micro_train_batch_size: int | None = Field(None, ge=1, le=1_000_000)
    """``--micro_train_batch_size``: sequences per actor (and critic) forward and backward; null: 4."""

    micro_rollout_batch_size: int | None = Field(None, ge=1, le=1_000_000)
    """``--micro_rollout_batch_size``: sequences per no-grad forward of the actor's and the reference's
    log-probabilities (and the critic's values, the reward model's rewards); null: 8."""

    prompt_max_len: int | None = Field(None, ge=1, le=100_000_000)
    """``--prompt_max_len``: tokens of a prompt; null: 1024."""

    generate_max_len: int | None = Field(None, ge=1, le=100_000_000)
    """``--generate_max_len``: tokens generated per response; null: 1024."""

    packing_samples: bool | None = None
    """``--packing_samples`` (sequences packed without padding, flash-attn varlen): true is refused (not
    modelled); null: false."""


class Rl(_Strict):
    """Reinforcement-learning post-training (train.objective: grpo, rloo or ppo): the reference model and the rollout."""

    beta: float | None = Field(None, ge=0, le=1_000_000, allow_inf_nan=False)
    """KL coefficient (TRL ``beta``, default 0.0 since TRL 0.19; RLOO's 0.05): with 0 no reference model is loaded.

    null: the trainer's default, RLOOConfig's 0.05 under ``train.objective: rloo`` (TRL v1.16.0: a reference model
    is loaded), else GRPOConfig's at ``software.trl``: 0.04 before TRL 0.19.0, 0.0 from it (spec/defaults.py,
    facts/trl.py ``GRPO_BETA_ROWS``).

    TRL v1.9.0 ``GRPOTrainer.__init__``: ``if self.beta == 0.0: self.ref_model = None``."""

    reference_model: ReferenceModel | None = None
    """Where the reference log-probabilities come from: none, shared (the policy's base with its PEFT adapters
    disabled: no second copy), or separate (a second copy of the model, loaded like the policy).  null: TRL's
    rule (none when beta is 0, shared under PEFT, else separate); a value TRL would not use is refused.

    TRL v1.9.0 ``GRPOTrainer.__init__`` (``elif is_peft_model(model): self.ref_model = None``, else
    ``create_model_from_path`` with the policy's ``model_init_kwargs``)."""

    rollout: Rollout = Field(default_factory=Rollout)
    """The rollout engine."""

    precompute_ref_log_probs: bool = False
    """DPO: the reference log-probabilities computed over the whole dataset before training (TRL
    ``DPOConfig.precompute_ref_log_probs``, default False: the reference forward runs inside each step).  True is
    refused (not modelled: the pass in ``DPOTrainer.__init__``, outside autocast, is not a phase yet).

    TRL v1.9.0 ``DPOTrainer.__init__`` (``_precompute_ref_logps``, ``self.ref_model = None``); KTO likewise
    (``KTOConfig.precompute_ref_log_probs``, TRL v1.16.0), refused too."""

    reward_model: str | None = None
    """PPO: the reward model (TRL ``PPOConfig.reward_model_path``, loaded as ``AutoModelForSequenceClassification``
    with ``num_labels=1``).  null or the scenario's ``model``: a model of the policy's architecture with a one-output
    score head instead of the LM head (TRL's examples train the reward model from the SFT policy); another id is
    refused (not modelled yet).  Under framework openrlhf (any objective): ``--reward_pretrain``, a
    ``RewardModelActor`` on the GPUs (the model's id; another is refused); null is ``--remote_rm_url`` (a reward
    function outside the GPUs).

    TRL v1.12.0 ``trl/experimental/ppo/ppo_trainer.py`` ``PPOTrainer.__init__`` (``self.reward_model.to(device)``)."""

    value_model: str | None = None
    """PPO: the value model, trained with the policy (TRL's ``value_model``, usually loaded from the reward model's
    path).  null or the scenario's ``model``: the policy's architecture with a one-output score head; another id is
    refused (not modelled yet).  Under framework openrlhf (train.objective ppo): ``--critic_pretrain``, the same
    rule (OpenRLHF's null: the reward model's path, else the policy's).

    TRL v1.12.0 ``PolicyAndValueWrapper(policy, value_model)``: one optimizer over both models' parameters."""

    num_mini_batches: int = Field(1, ge=1, le=1_000_000)
    """PPO: mini-batches each rollout batch is split into (TRL ``PPOConfig.num_mini_batches``, default 1); the rollout
    batch (micro_batch_size x grad_accum_steps) must be a multiple of it.  The memory does not depend on it: every
    forward is micro_batch_size sequences.

    TRL v1.12.0 ``PPOTrainer.__init__`` (``local_mini_batch_size = exact_div(local_batch_size, num_mini_batches)``)."""

    rollout_forward_batch_size: int = Field(64, ge=1, le=1_000_000)
    """PPO: sequences per generate call and per no-grad scoring forward (TRL ``PPOConfig.local_rollout_forward_batch_size``,
    default 64; at most the rollout batch, micro_batch_size x grad_accum_steps).

    TRL v1.12.0 ``batch_generation`` and the scoring loop of ``PPOTrainer.train``."""

    verl: Verl = Field(default_factory=Verl)
    """verl's hybrid-engine settings (``framework: verl``)."""

    openrlhf: OpenRlhf = Field(default_factory=OpenRlhf)
    """OpenRLHF's Ray layout settings (``framework: openrlhf``)."""


class Scenario(_Strict):
    """A validated scenario.  ``model`` is a catalog id/alias, a path, or an inline config mapping."""

    model: str | dict[str, Any]
    """Catalog id or alias, a path to a config.json or its folder, an inline config mapping, or a Hugging Face
    Hub id owner/name[@revision] (read into the Hugging Face cache; docs/models.md)."""

    task: Task = "train"
    """What runs: a training step, Hugging Face generate, or a vLLM engine."""

    hardware: Hardware = Field(default_factory=Hardware)
    """The GPUs."""

    framework: Framework | None = None
    """Whose memory conventions apply (docs/conventions.md); null: vllm for serve, deepspeed with a ZeRO stage,
    else hf-trainer.  litgpt is Lit-GPT's scripts, the conventions framework lightning has always meant here;
    torchtune is torchtune's recipes (its own model, torchao NF4 for QLoRA, adapters in the model's dtype); verl is
    verl's FSDP + vLLM hybrid engine for train.objective grpo (``rl.verl``, docs/rl.md); megatron is Megatron-LM
    training its own GPT model with Megatron-Core (``parallel.megatron``, docs/conventions.md); openrlhf is OpenRLHF's
    DeepSpeed + vLLM Ray layout for train.objective grpo or ppo (``rl.openrlhf``, docs/rl.md); axolotl and llamafactory
    (LLaMA-Factory) run the HF Trainer, so hf-trainer's conventions apply, with their own handling of a bitsandbytes
    base under LoRA/QLoRA (facts/trainer_frameworks.py): axolotl casts the norms and embeddings back to the model's
    dtype after peft's k-bit preparation, LLaMA-Factory never runs that preparation; full fine-tuning under axolotl
    (embeddings and norms upcast to fp32 unless its attention or Cut Cross-Entropy needs them cast back) is
    refused."""

    train: Train = Field(default_factory=Train)
    """The training step (task train)."""

    inference: Inference = Field(default_factory=Inference)
    """The generate call (task inference)."""

    serve: Serve = Field(default_factory=Serve)
    """The serving engine (task serve): vLLM, or SGLang with serve.engine."""

    parallel: Parallel = Field(default_factory=Parallel)
    """Parallelism degrees, sharding and offload."""

    software: Software = Field(default_factory=Software)
    """Library versions whose memory behaviour differs."""

    lifecycle: Lifecycle = Field(default_factory=Lifecycle)
    """The job's phases around the steady training step (task train): load, evaluation, checkpoint save."""

    rl: Rl = Field(default_factory=Rl)
    """RL post-training (train.objective: grpo): reference model and rollout engine (docs/rl.md)."""

    offline: bool = Field(default=False, exclude=True)
    """Resolve a Hugging Face Hub id (owner/name[@revision]) from the local Hugging Face cache only, with no
    network (as HF_HUB_OFFLINE=1 does); a catalog name or a local path never needs the network.

    How the model is found, not what is estimated: left out of the report's ``scenario`` record
    (docs/models.md)."""

    @field_validator("model")
    @classmethod
    def _model_not_empty(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(v, str) and not v.strip():
            raise ValueError("must name a model (catalog id or alias, a config.json path, or an inline mapping)")
        return v

    @property
    def effective_framework(self) -> Framework:
        if self.framework == "litgpt":
            # the same conventions: vramplan's lightning has always meant Lit-GPT's finetune and generate scripts
            return "lightning"
        if (row := trainer_framework(self.framework)) is not None:
            # axolotl and LLaMA-Factory train with the HF Trainer; their own k-bit handling is read from the row
            return cast(Framework, row.runs_as)
        if self.framework is not None:
            return self.framework
        if self.task == "serve":
            return "vllm"
        if self.parallel.zero_stage > 0:
            return "deepspeed"
        return "hf-trainer"

    @property
    def deepspeed_engine(self) -> bool:
        """DeepSpeed's engine runs the training step and owns its precision: framework deepspeed, or a ZeRO stage
        without torch FSDP under the HF Trainer, accelerate or Lightning, which hand the model to
        ``deepspeed.initialize``.

        The engine casts the module's parameters to the half dtype when fp16 or bf16 is on
        (``DeepSpeedEngine._configure_distributed_model``, deepspeed v0.9-0.19.8) and its optimizer keeps fp32 masters;
        accelerate turns torch autocast off under DeepSpeed (``Accelerator.__init__``: ``native_amp`` only when the
        distributed type is not DEEPSPEED, accelerate 0.20-1.15; the HF Trainer prepares through it), and Lightning's
        ``DeepSpeedPrecision`` converts only ``*-true`` modules and opens no autocast context (lightning 2.0-2.5
        ``plugins/precision/deepspeed.py``).  So ``*-mixed`` there is DeepSpeed's half module with fp32 masters,
        with no autocast weight cache (facts/precisions.py, family deepspeed)."""
        fw = self.effective_framework
        return fw == "deepspeed" or (fw in ("hf-trainer", "accelerate", "lightning") and self.parallel.zero_stage > 0
                                     and self.parallel.fsdp == "none")

    @property
    def data_parallel_degree(self) -> int:
        mp = self.parallel.tp * self.parallel.pp * self.parallel.cp
        return max(1, self.hardware.num_gpus // mp)

    @property
    def shard_degree(self) -> int:
        """The ranks that hold one copy of the model and reduce its gradients, which ZeRO, FSDP and Megatron-LM's
        distributed optimizer shard it over: data-parallel x context-parallel.  Context-parallel ranks hold the same
        parameters and see other tokens of the same sequences, so every framework that runs context parallelism
        shards and reduces over them too: torchtitan's ``dp_shard_cp`` mesh (``ParallelDims``: "Mesh for param
        sharding", ``fsdp_enabled = dp_shard_enabled or cp_enabled``; PR 685 "apply fsdp to model when CP is enabled
        without DP"), Megatron-LM's optimizer on ``get_data_parallel_group(with_context_parallel=True)``
        (``megatron/core/optimizer/__init__.py`` ``get_megatron_optimizer``) and DeepSpeed's ZeRO on
        ``seq_data_parallel_group`` (``engine.py`` ``_configure_zero_optimizer``: Ulysses sequence parallelism)."""
        return self.data_parallel_degree * self.parallel.cp
