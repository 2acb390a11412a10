"""Terms resident for the whole step: the parameters (or their offloaded copy), the cuBLAS workspaces,
DDP's buckets."""

from __future__ import annotations

from vramplan.analytic.gradients import ddp_bucket_bytes
from vramplan.analytic.moment import K
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.terms.base import Term, resident
from vramplan.analytic.terms.context import KBIT_PREPARED, StepContext
from vramplan.analytic.weights import quantized_linear_bytes, tower_quantized_elements, weights_bytes
from vramplan.facts.torchtune import torchao_nf4_bytes
from vramplan.units import ceil_div

__all__ = ["ddp_buckets", "offload_where", "parameter_bytes", "parameters", "workspaces"]


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
    if c.quant != "none" and c.framework in KBIT_PREPARED:
        # peft.prepare_model_for_kbit_training casts every non-quantized parameter to fp32
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


def workspaces(c: StepContext) -> list[Term]:
    """cuBLAS workspaces: two handles, the forward's thread and autograd's (analytic/overhead.py)."""
    return [resident(K.CUBLAS, cublas_workspace_bytes(c.gpu, handles=2), "cublas")]


def ddp_buckets(c: StepContext) -> list[Term]:
    """DDP's reducer allocates its flat buckets when the model is wrapped and keeps them: resident always."""
    par = c.s.parallel
    # Megatron-Core reduces from its grad buffer, the gradients themselves (terms/gradients.py megatron_grad_buffer)
    used = c.framework not in ("deepspeed", "megatron") and par.zero_stage == 0 and par.fsdp == "none"
    nbytes = ddp_bucket_bytes(c.trainable, c.pol.grad_bytes, c.s.data_parallel_degree) if used else 0
    return [resident(K.DDP_BUCKETS, nbytes, "ddp")]
