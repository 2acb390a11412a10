"""Terms resident for the whole step: the parameters (or their offloaded copy), the buffers older transformers
releases register, the cuBLAS workspaces, DDP's buckets."""

from __future__ import annotations

from vramplan.analytic.deepspeed import deepspeed_zero
from vramplan.analytic.gradients import ddp_bucket_bytes
from vramplan.analytic.hf_buffers import causal_mask_buffer_bytes, rope_cache_bytes
from vramplan.analytic.moment import K
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.weights import quantized_linear_bytes, tower_quantized_elements, weights_bytes
from vramplan.facts.torchtune import torchao_nf4_bytes
from vramplan.facts.transformers import OWN_MODEL_FRAMEWORKS
from vramplan.spec.defaults import torch_fsdp2
from vramplan.spec.load import Resolved
from vramplan.units import ceil_div

__all__ = ["ddp_buckets", "hf_buffer_bytes", "hf_buffers", "hf_buffers_of", "offload_where", "parameter_bytes", "parameters",
           "workspaces"]


def offload_where(c: StepContext) -> str:
    """Where offloaded memory lives: the host, or NVMe with ``offload_device: nvme`` (ZeRO-Infinity)."""
    return "nvme" if c.s.parallel.offload_device == "nvme" and c.offload_opt else "host"


def parameter_bytes(c: StepContext) -> tuple[int, int]:
    """(frozen or full base, adapters) bytes of this rank's stage, before ZeRO-3/FSDP sharding."""
    rp, pol = c.rp, c.pol
    if c.peft is None:
        return rp.total * pol.param_bytes, 0
    dense_bytes = pol.frozen_param_bytes
    base = weights_bytes(rp, dense_bytes, c.quant)
    if c.litgpt_head:
        # Lit-GPT's own head, quantized, in place of a half-precision (or, tied, absent) transformers head
        base += quantized_linear_bytes(c.litgpt_head, c.litgpt_head // c.m.hidden_size, c.quant) \
            - rp.lm_head * dense_bytes
    if c.quant != "none" and c.framework == "torchtune":
        # torchao's NF4Tensor in place of bitsandbytes' nf4-dq layout: a bf16 second-level factor, and the scaler
        # mean and lookup table per matrix (facts/torchtune.py)
        base += torchao_nf4_bytes(rp.linear, sum(n for *_, n in rp.linear_shapes)) \
            - quantized_linear_bytes(rp.linear, rp.linear_out_features, c.quant)
    if c.kbit:
        # peft.prepare_model_for_kbit_training casts every non-quantized parameter to fp32 (Unsloth's own does not;
        # axolotl casts the norms and embeddings back, LLaMA-Factory runs none)
        base += (rp.total - rp.linear - tower_quantized_elements(rp, c.quant)) * (4 - dense_bytes)
    return base, c.trainable * c.adapter


def parameters(c: StepContext) -> list[Term]:
    """The parameters resident on this GPU (its ZeRO-3/FSDP shard), or on the host when offloaded."""
    base, adapters = parameter_bytes(c)
    shard_p = c.shards[2]
    if c.offload_params:
        return [resident(K.PARAMETERS, 0, "parameters"),
                resident(K.PARAMETERS, ceil_div(base + adapters, shard_p), "parameters.offloaded",
                         where=offload_where(c))]
    return [resident(K.PARAMETERS, ceil_div(base, shard_p) + ceil_div(adapters, shard_p), "parameters")]


def hf_buffer_bytes(c: StepContext) -> tuple[int, int]:
    """(rotary caches of this stage's layers, causal-mask buffer) that ``software.transformers`` registers at
    construction (analytic/hf_buffers.py); (0, 0) under a framework that runs its own model code.

    Their dtype: the one the model is built in (the stored parameters', the frozen base's under PEFT), or the half
    dtype where the whole module is cast to it (DeepSpeed's bit16 module: its policy's parameters; FSDP1's
    MixedPrecision(buffer_dtype) under a mixed precision)."""
    version = c.s.software.transformers_version
    if c.framework in OWN_MODEL_FRAMEWORKS or version is None:
        return 0, 0
    pol = c.pol
    elem, inv_freq = (pol.frozen_param_bytes if c.peft is not None else pol.param_bytes), 4
    if deepspeed_zero(c.s) and pol.compute_bytes < 4:
        elem = inv_freq = pol.compute_bytes  # DeepSpeed's module.half() / module.bfloat16(): every float buffer
    elif c.s.parallel.fsdp != "none" and not torch_fsdp2(c.s) and pol.compute_bytes < pol.param_bytes:
        # FSDP1's MixedPrecision(buffer_dtype=the half dtype), as accelerate sets it (utils/dataclasses.py
        # set_mixed_precision: buffer_dtype for fsdp_version 1 only); FSDP2's MixedPrecisionPolicy casts no buffer
        elem = inv_freq = pol.compute_bytes
    return (rope_cache_bytes(c.m, version, len(c.layer_specs), elem, inv_freq),
            causal_mask_buffer_bytes(c.m, version) if c.stage == 0 else 0)


def hf_buffers_of(r: Resolved) -> tuple[int, int]:
    """``hf_buffer_bytes`` of a training job's first stage, for the traced engine (one rank, its model built by the
    installed transformers, which registers none of them: it adds them as allocations of their own)."""
    return hf_buffer_bytes(StepContext(r, 0, "flash", False))


def hf_buffers(c: StepContext) -> list[Term]:
    """The buffers older transformers releases register at construction, resident on every rank (not sharded)."""
    rope, mask = hf_buffer_bytes(c)
    return [resident(K.HF_ROPE_BUFFERS, rope, "hf.rope_buffers"), resident(K.HF_CAUSAL_MASK, mask, "hf.causal_mask")]


def workspaces(c: StepContext) -> list[Term]:
    """cuBLAS workspaces: two handles, the forward's thread and autograd's (analytic/overhead.py)."""
    return [resident(K.CUBLAS, cublas_workspace_bytes(c.gpu, handles=2), "cublas")]


def ddp_buckets(c: StepContext) -> list[Term]:
    """DDP's reducer allocates its flat buckets when the model is wrapped and keeps them: resident always."""
    par = c.s.parallel
    # Megatron-Core reduces from its grad buffer, the gradients themselves (terms/gradients.py megatron_grad_buffer)
    used = c.framework not in ("deepspeed", "megatron") and par.zero_stage == 0 and par.fsdp == "none"
    nbytes = ddp_bucket_bytes(c.trainable, c.pol.grad_bytes, c.s.shard_degree) if used else 0
    return [resident(K.DDP_BUCKETS, nbytes, "ddp")]
