"""The training step: memory over time on one GPU, and its peak.

A step is walked through the moments where memory can peak (not summed):

1. end of the forward pass, at the loss's log_softmax;
2. start of the backward pass, at the loss gradient;
3. during each layer's backward (activations shrink as gradients grow);
4. the optimizer step (all gradients + step temporaries).

Gradients exist during the forward pass only from the second micro-batch of a
gradient-accumulation window on (the Trainer zeroes them with ``set_to_none=True``
after each optimizer step), so with ``grad_accum_steps > 1`` the steady-state peak
micro-step carries all gradients.  Optimizer states are alive during the whole
steady-state step (they are created on the first ``step()``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vramplan.analytic import activations as act
from vramplan.analytic.events import StepLayout, build_layout
from vramplan.analytic.gradients import (
    ddp_bucket_bytes,
    gradient_bytes,
    master_weight_bytes,
    tied_embedding_accumulation_bytes,
)
from vramplan.analytic.layout import (
    LoraTargets,
    RankParams,
    gathers_logits,
    lora_targets,
    quantized_expert_loop,
    rank_params,
    replicated_embedding_grad,
)
from vramplan.analytic.logits import loss_bytes
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.optimizer import optimizer_cost
from vramplan.analytic.overhead import cublas_workspace_bytes
from vramplan.analytic.precision import PrecisionPolicy, adapter_bytes, policy
from vramplan.analytic.weights import weights_bytes
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec, ParamGroup
from vramplan.spec.scenario import Scenario
from vramplan.units import ceil_div


@dataclass
class TrainResult:
    moments: list[Moment]
    peak: Moment
    host_bytes: int
    nvme_bytes: int
    managed_bytes: int
    communicators: int
    assumptions: list[str]
    layout: StepLayout | None = None  # the peak stage's terms for the event stream (analytic/events.py)


# Model types whose transformers class has no SDPA path (``_supports_sdpa = False``): gpt-oss, whose per-head
# attention sinks join the softmax (modeling_gpt_oss.py).  transformers' default falls back to eager for them
# (modeling_utils ``get_correct_attn_implementation``), which is what the default ``sdpa`` is taken to mean.
NO_SDPA = frozenset({"gpt_oss"})


def resolve_attention(s: Scenario, m: ModelSpec, pol: PrecisionPolicy) -> tuple[str, bool]:
    """The kernel that runs, as PyTorch's SDPA dispatcher would pick it on a CUDA GPU.

    SDPA picks flash for fp16/bf16 with head_dim <= 256, else memory-efficient (which also
    takes fp32); both save no s x s tensor.  ``eager`` materializes the scores and repeats
    K/V to every query head (transformers' ``repeat_kv``).
    """
    want = s.train.attention if s.task == "train" else s.inference.attention
    if want == "eager" or (want == "sdpa" and m.model_type in NO_SDPA):
        return "eager", m.num_kv_heads < m.num_attention_heads
    if want == "flash":
        return "flash", False
    if m.model_type == "falcon" and m.num_kv_heads == 1 < m.num_attention_heads:
        # FalconAttention (multi_query) hands SDPA one K/V head without enable_gqa; the fused kernels need
        # equal head counts then (sdp_utils_cpp.h check_batch_size_and_num_heads_dense), so SDPA runs math
        return "math", False
    if pol.compute_bytes == 4 or m.head_dim > 256:
        return "efficient", False
    return "flash", False


def _stages(pp: int) -> list[int]:
    return [0] if pp == 1 else [0, pp - 1]


def _shards(s: Scenario, dp: int) -> tuple[int, int, int]:
    """(optimizer/master shards, gradient shards, parameter shards) for ZeRO / FSDP."""
    par = s.parallel
    fsdp = par.fsdp
    group = dp
    if fsdp == "hybrid_shard":
        group = max(1, min(dp, s.hardware.gpus_per_node))
    if fsdp in ("full_shard", "hybrid_shard"):
        return group, group, group
    if fsdp == "shard_grad_op":
        return group, group, 1
    z = par.zero_stage
    return (dp if z >= 1 else 1, dp if z >= 2 else 1, dp if z >= 3 else 1)


def train_step(r: Resolved) -> TrainResult:
    s, m, gpu = r.scenario, r.model, r.gpu
    t, par = s.train, s.parallel
    framework = s.effective_framework
    pol = policy(s)
    adapter = adapter_bytes(s, pol)  # bytes per adapter element (unused without PEFT)
    if t.peft is not None and framework != "deepspeed":
        # the adapters (the trainable parameters) are fp32 with peft >= 0.12 (get_peft_model's
        # autocast_adapter_dtype=True), or the base weight's dtype with older peft (precision.adapter_bytes);
        # their gradients and optimizer states follow
        from dataclasses import replace

        pol = replace(pol, param_bytes=adapter, grad_bytes=adapter)
    dp = s.data_parallel_degree
    tp, pp, cp, ep = par.tp, par.pp, par.cp, par.ep
    shard_os, shard_g, shard_p = _shards(s, dp)
    sharded_params = shard_p > 1
    peft = t.peft
    quant = t.quantization if peft is not None else "none"
    attention, repeat = resolve_attention(s, m, pol)
    assumptions: list[str] = []
    tokens = ceil_div(t.micro_batch_size * t.seq_len, cp)
    results: list[tuple[Moment, list[Moment], int, int, int, StepLayout]] = []

    lt = lora_targets(peft, m, s.software.fused_moe_experts, quant)
    for stage in _stages(pp):
        rp = rank_params(m, tp, pp, ep, stage, peft, lt)
        trainable = rp.lora if peft is not None else rp.total
        decay = rp.lora if peft is not None else rp.decay
        # ---------------- persistent state ----------------
        if peft is not None:
            dense_bytes = pol.frozen_param_bytes
            base = weights_bytes(rp, dense_bytes, quant)
            if quant != "none" and framework in ("hf-trainer", "accelerate", "plain"):
                # peft.prepare_model_for_kbit_training casts every non-quantized parameter to fp32
                base += (rp.total - rp.linear) * (4 - dense_bytes)
            adapters = trainable * adapter
        else:
            base = rp.total * pol.param_bytes
            adapters = 0
        offload_params = par.offload == "optimizer+params"
        offload_opt = par.offload != "none"
        weights_resident = 0 if offload_params else ceil_div(base, shard_p) + ceil_div(adapters, shard_p)
        grads = gradient_bytes(trainable, pol.grad_bytes, shard_g)
        # transformers' tensor parallelism: the vocabulary-parallel embedding's gradient is replicated
        # (layout.HF_TP_FRAMEWORKS); the optimizer copies this rank's row shard out of it
        emb_full = replicated_embedding_grad(m, tp, framework) if peft is None and rp.has_embedding else 0
        emb_rep_bytes = ceil_div(emb_full - ceil_div(emb_full, tp), shard_g) * pol.grad_bytes
        grads += emb_rep_bytes
        ddp_used = framework != "deepspeed" and par.zero_stage == 0 and par.fsdp == "none"
        ddp = ddp_bucket_bytes(trainable, pol.grad_bytes, dp) if ddp_used else 0
        master = master_weight_bytes(trainable, shard_os, pol.master_bytes) if pol.master_bytes else 0
        opt_param_bytes = 4 if pol.master_bytes else pol.param_bytes
        small = sum(p.total for p in m.params if p.numel < 4096) if peft is None else 0
        factored = _adafactor_state(m) if t.optimizer == "adafactor" and peft is None else trainable
        oc = optimizer_cost(
            t.optimizer if not (framework == "deepspeed" and t.optimizer == "adamw") else "adamw-fused",
            ceil_div(trainable, shard_os), ceil_div(decay, shard_os), opt_param_bytes,
            small_tensor_params=ceil_div(small, shard_os), adafactor_factored=ceil_div(factored, shard_os),
            largest_param=rp.largest_linear if peft is None else m.hidden_size * (peft.rank if peft else 0),
            adafactor_tensors=_adafactor_tensors(m, rp, tp, shard_os) if t.optimizer == "adafactor" and peft is None
            else (),
        )
        states, managed, step_temp = oc.state_bytes, oc.managed_bytes, oc.step_temporary_bytes
        host = nvme = 0
        if offload_opt:
            # ZeRO-Offload (arXiv 2101.06840): fp32 masters, moments and fp32 gradients live on the host
            host += states + managed + master + ceil_div(trainable, shard_os) * 4
            states = managed = master = step_temp = 0
        if offload_opt:
            # gradients are copied to the host partition as they are reduced (ZeRO-Offload)
            grads = 0
        if offload_params:
            host += ceil_div(base + adapters, shard_p)
        if par.offload_device == "nvme" and offload_opt:
            nvme, host = host, 0
        if pol.master_bytes and not offload_opt:
            # DeepSpeed builds an fp32 copy of the gradient partition for the optimizer step
            step_temp += ceil_div(trainable, shard_os) * 4
        if emb_full and not offload_opt:
            step_temp += ceil_div(ceil_div(emb_full, tp), shard_os) * pol.grad_bytes
        workspaces = cublas_workspace_bytes(gpu, handles=2)

        # ---------------- activations ----------------
        kbit = peft is not None and quant in ("nf4", "nf4-dq", "fp4", "int8") and framework in (
            "hf-trainer", "accelerate", "plain")
        tgt = lt.linear
        ctx = act.ActContext(
            compute_bytes=pol.compute_bytes, residual_bytes=_residual_bytes(pol, peft is not None, kbit),
            linear_input_bytes=pol.linear_input_bytes, autocast=pol.autocast, attention=attention,
            gqa_repeat=repeat, seq_len=t.seq_len, tp=tp, ep=ep, sequence_parallel=par.sequence_parallel,
            frozen_base=peft is not None, lora_targets=tgt, lora_rank=peft.rank if peft else 0,
            lora_dropout=bool(peft and peft.dropout > 0), dora=bool(peft and peft.method == "dora"),
            elementwise_bytes=4 if (kbit and pol.autocast) else 0,
            expert_bytes=pol.param_bytes if peft is None else pol.frozen_param_bytes,
            expert_loop=quantized_expert_loop(m, quant if peft is not None else "none"),
            gate_up_wrapped=bool(lt.gate_up_rank), down_wrapped=bool(lt.down_rank), router_wrapped=bool(lt.router_rank),
            sdpa=t.attention == "sdpa", adapter_bytes=adapter,
            kbit_saves_input=(peft is not None and quant in ("nf4", "nf4-dq", "fp4")
                              and s.software.bnb_4bit_saves_input),
        )
        layer_specs = [m.layers[i] for i in rp.layers]
        full = [act.layer_saved_per_token(m, ls, ctx) * tokens for ls in layer_specs]
        dora = 0
        if peft is not None and peft.method == "dora":
            per_tok, const = _dora_saved(m, tgt, peft.rank, pol.compute_bytes if pol.autocast else 4, tp)
            dora = per_tok * tokens + const
            full = [f + dora for f in full]
        wx = None
        if m.moe is not None and (lt.experts_wrapped or lt.router_rank):
            wx = act.wrapped_experts(m, lt.gate_up_rank, lt.down_rank, lt.router_rank, pol.frozen_param_bytes,
                                     adapter, ctx)
            full = [f + (wx.saved if ls.moe else 0) for f, ls in zip(full, layer_specs, strict=True)]
        attention_idle: set[int] = set()  # layers of the frozen prefix whose attention records nothing
        if peft is not None and t.gradient_checkpointing == "none" and rp.has_embedding and full:
            # the frozen embeddings' output does not require grad (peft enables input gradients only with
            # checkpointing), and autograd records nothing until the first op with an input that does
            # (an adapter's weight): the first layer's input norm never, its attention block (and the norm
            # after it) only when an attention module carries an adapter, its MLP only what its own
            # adapters need (activations.frozen_input_mlp); a layer without any adapter leaves the residual
            # stream frozen for the next one (DeepSeek's dense first layer under LoRA on the experts alone)
            attn_mods = {p.module for p in m.params if p.layer_span and ("attn" in p.name or "attention" in p.name)}
            attn_adapted = bool(lt.linear & attn_mods)
            for j, ls in enumerate(layer_specs):
                unsaved = act.frozen_input_eager_unsaved(m, ls, ctx) if attn_adapted else 0
                if attn_adapted and not m.parallel_residual:
                    full[j] -= min(full[j], (act._norm_saved(m.norm, ctx) * m.hidden_size + unsaved) * tokens)
                    break
                mlp, mlp_live = act.frozen_input_mlp(m, ls, ctx)
                # a parallel block's attention reads the same frozen normalised input, adapters or not
                attn = act.attention_saved(m, ls, ctx) - unsaved if attn_adapted else 0
                live = mlp_live or attn_adapted
                full[j] = (attn + mlp) * tokens + (dora if live else 0) + (
                    wx.prefix_saved if wx is not None and ls.moe else 0)
                if not attn_adapted:
                    attention_idle.add(j)
                if live:
                    break
        if t.gradient_checkpointing == "full":
            kept = [act.checkpoint_saved_per_token(m, ctx) * tokens for _ in layer_specs]
        elif t.gradient_checkpointing == "selective":
            kept = [act.selective_saved_per_token(m, ls, ctx) * tokens for ls in layer_specs]
        else:
            kept = list(full)
        transients = [act.backward_transients_per_token(m, ls, ctx) for ls in layer_specs]
        mlp_transient = [tr[0] * tokens for tr in transients]
        attn_transient = [0 if j in attention_idle else tr[1] * tokens for j, tr in enumerate(transients)]
        # with full checkpointing the layer is recomputed whole, so its MLP part is in ``full``
        released = [act.freed_before_attention_backward_per_token(m, ls, ctx) * tokens for ls in layer_specs]
        mlp_released = [act.freed_before_mlp_backward_per_token(m, ls, ctx) * tokens for ls in layer_specs]
        if wx is not None and lt.experts_wrapped:
            for j, ls in enumerate(layer_specs):
                if ls.moe:
                    mlp_transient[j], mlp_released[j] = act.wrapped_experts_backward(
                        m, wx, ctx, tokens, mlp_transient[j], mlp_released[j])
        transient = [max(mt, at) for mt, at in zip(mlp_transient, attn_transient, strict=True)]
        shared = act.shared_saved_per_token(m, ctx, t.gradient_checkpointing,
                                            attention_recorded=len(attention_idle) < len(layer_specs)) * tokens
        # 1F1B keeps up to pp micro-batches in flight on the first stage (arXiv 2104.04473 sec. 2.2)
        in_flight = min(pp - stage, t.grad_accum_steps) if pp > 1 else 1
        last = stage == pp - 1
        # Megatron's vocabulary-parallel cross-entropy keeps the logits sharded; transformers' tp_plan
        # all-gathers them (layout.HF_TP_FRAMEWORKS)
        vocab_rank = m.vocab_size if gathers_logits(framework, tp) else ceil_div(m.vocab_size, tp)
        loss = loss_bytes(tokens, vocab_rank,
                          pol.compute_bytes, softcap=m.final_logit_softcapping is not None and m.model_type == "gemma2")
        # final norm + LM-head input
        head_saved = (act._norm_saved(m.norm, ctx) * m.hidden_size + (
            pol.compute_bytes * m.hidden_size if peft is None else 0)) * tokens if last else 0
        head_cast = 0
        if last and kbit and pol.autocast:
            # the frozen LM head is fp32 after prepare_model_for_kbit_training; autocast casts it to the
            # half dtype for the matmul, which saves that copy to compute the input's gradient
            head_cast = ceil_div(m.vocab_size, tp) * m.hidden_size * pol.compute_bytes

        # autocast's cached half copies of trainable linear weights (HF/Lightning mixed precision)
        cast_per_layer = [0] * len(layer_specs)
        cast_head = 0
        if pol.weight_cast_bytes and peft is None and pol.autocast:
            lin_layer = _linear_params_per_layer(rp, m)
            cast_per_layer = [lin_layer * pol.weight_cast_bytes for _ in layer_specs]
            if last:
                head_params = rp.lm_head if rp.lm_head else (ceil_div(m.vocab_size, tp) * m.hidden_size
                                                             if m.tie_word_embeddings else 0)
                cast_head = head_params * pol.weight_cast_bytes
            assumptions.append("autocast keeps a half-precision copy of each trainable linear weight from the "
                               "forward pass until its backward (torch.autocast weight cache)")

        # ZeRO-3 / FSDP: full (gathered) parameters of the running unit and the prefetched one
        gathered = 0
        root_gathered = 0
        if sharded_params:
            layer_p = max(rp.per_layer) if rp.per_layer else 0
            half = 2 if pol.compute_bytes <= 2 else 4
            if peft is not None and quant != "none":
                layer_p_bytes = weights_bytes(_one_layer(rp, layer_p), pol.frozen_param_bytes, quant)
            else:
                layer_p_bytes = layer_p * half
            gathered = 2 * layer_p_bytes  # current + prefetched unit (FSDP limit_all_gathers; DS prefetch)
            if par.fsdp != "none":
                root_gathered = rp.outside_layers * half  # FSDP root unit (embeddings, head) stays unsharded

        # ---------------- the moments ----------------
        grads_during_fwd = t.grad_accum_steps > 1 or in_flight > 1
        grad_layer = [_grad_bytes_layer(rp, i, trainable, pol, shard_g, peft) for i in range(len(layer_specs))]
        if offload_opt:
            grad_layer = [0] * len(grad_layer)
        grad_outside = max(0, grads - sum(grad_layer))
        base_static = Moment("")
        base_static.add(K.PARAMETERS, weights_resident)
        base_static.add(K.GATHERED_ROOT, root_gathered)
        base_static.add(K.OPTIMIZER_STATES, states, optimizer=t.optimizer)
        base_static.add(K.MASTER, master)
        base_static.add(K.CUBLAS, workspaces)
        moments: list[Moment] = []

        # DDP's reducer allocates its flat buckets when the model is wrapped and keeps them: resident always
        base_static.add(K.DDP_BUCKETS, ddp)

        def static(phase: str, with_grads: bool, base_static: Moment = base_static, grads: int = grads) -> Moment:
            mo = base_static.copy(phase)
            if with_grads:
                mo.add(K.GRADIENTS, grads)
            return mo

        acts_total = sum(kept) * in_flight
        fwd = static("forward", grads_during_fwd)
        fwd.add(K.SAVED, acts_total + shared + head_saved)
        fwd.add(K.CASTS, sum(cast_per_layer) + cast_head + head_cast)
        fwd.add(K.GATHERED, gathered)
        if last:
            fwd.add(K.LOSS_FORWARD, loss.forward_peak)
        else:
            fwd.add(K.LAYER_FORWARD, max(transient) if transient else 0)
        moments.append(fwd)

        # With full checkpointing the layers' forward saves nothing, so their cast weights live only in
        # autocast's cache, which is cleared when the forward's autocast region ends; the recomputation
        # casts the layer's weights again and keeps them until that layer's backward.
        full_ckpt = t.gradient_checkpointing == "full"
        kept_casts = 0 if full_ckpt else sum(cast_per_layer)
        if last:
            b0 = static("backward", grads_during_fwd)
            b0.add(K.SAVED, acts_total + shared + head_saved)
            b0.add(K.CASTS, kept_casts + cast_head + head_cast)
            b0.add(K.LOSS_BACKWARD, loss.backward_peak)
            b0.add(K.GATHERED, gathered)
            moments.append(b0)
        # the input embedding's gradient is produced last (its backward runs after the first layer's);
        # a tied embedding gets its gradient at the LM head, first
        embed_grad = 0
        if peft is None and not m.tie_word_embeddings and rp.has_embedding:
            emb = sum(p.total for p in m.params if p.role in ("embedding", "position"))
            embed_grad = min(grad_outside, ceil_div(ceil_div(emb, tp), shard_g) * pol.grad_bytes + emb_rep_bytes)
        produced = 0 if grads_during_fwd else grad_outside - embed_grad
        for j in range(len(layer_specs) - 1, -1, -1):
            mo = static("backward", grads_during_fwd)
            alive = sum(kept[: j + 1]) + (in_flight - 1) * sum(kept)
            recompute = full[j] - kept[j] if t.gradient_checkpointing != "none" else 0
            selective = t.gradient_checkpointing == "selective"
            # selective recomputation re-runs only the attention core, when its backward comes
            # by the MLP's elementwise backward, the output projection's backward has freed its input
            mo.add(K.SAVED, alive + shared + (0 if selective else recompute)
                   - min(mlp_released[j], alive + recompute))
            # (the output projection's cast weight is released with its saved input, before the MLP's
            # elementwise backward)
            down_cast = (m.hidden_size * ceil_div(layer_specs[j].intermediate_size, tp) * pol.weight_cast_bytes
                         if cast_per_layer[j] and not layer_specs[j].moe else 0)
            mo.add(K.CASTS,
                   (cast_per_layer[j] if full_ckpt else sum(cast_per_layer[: j + 1])) - down_cast)
            split = bool(released[j])
            mo.add(K.LAYER_BACKWARD, mlp_transient[j] if split else transient[j])
            mo.add(K.GATHERED, gathered)
            if sharded_params:
                mo.add(K.UNSHARDED_GRADS,
                       _grad_bytes_layer(rp, j, trainable, pol, 1, peft))
            before = produced
            if not grads_during_fwd:
                produced += grad_layer[j]
                # during the MLP's backward this layer has produced its down projection's gradient
                mo.add(K.GRADIENTS,
                       before + _down_grad_bytes(m, layer_specs[j], grad_layer[j], peft, lt, rp, j, tp, ep) if split
                       else produced)
            moments.append(mo)
            if split:
                # the MLP's backward runs on the whole layer; the attention's backward comes after the
                # MLP's (and the post-attention norm's) saved tensors are released
                late = mo.copy("backward")
                late.set(K.LAYER_BACKWARD, attn_transient[j])
                late.set(K.SAVED, late.get(K.SAVED) + (recompute if selective else 0) - min(
                    released[j], alive + recompute) + min(mlp_released[j], alive + recompute))
                if not grads_during_fwd and produced:
                    late.set(K.GRADIENTS, produced)
                moments.append(late)
        if peft is None and m.tie_word_embeddings and rp.has_embedding and last and not offload_opt:
            # the embedding's backward, last: all gradients exist and the tied parameter's two
            # contributions are summed (gradients.tied_embedding_accumulation_bytes)
            end = static("backward", True)
            end.add(K.GATHERED, gathered)
            end.add(K.TIED_EMBEDDING, tied_embedding_accumulation_bytes(
                ceil_div(m.vocab_size, tp), m.hidden_size, pol.grad_bytes, head_grad_is_view=not pol.autocast))
            moments.append(end)
        step = static("optimizer", True)
        step.add(K.OPTIMIZER_STEP, step_temp)
        moments.append(step)
        peak = max(moments, key=lambda mo: mo.total)
        lay = build_layout(
            m, rp, ctx, layer_specs, tokens=tokens, kept=kept, full=full,
            transients=[(mt, at) for mt, at in zip(mlp_transient, attn_transient, strict=True)],
            cast_per_layer=cast_per_layer, grad_layer=grad_layer, grad_outside=grad_outside, embed_grad=embed_grad,
            weights_resident=weights_resident, trainable=ceil_div(trainable, shard_os), peft=peft is not None,
            optimizer=t.optimizer, states=states, step_temp=step_temp, master=master, ddp=ddp, workspaces=workspaces,
            gathered=gathered, root_gathered=root_gathered, shared=shared, head_saved=head_saved,
            head_cast=cast_head + head_cast, loss=loss, logits_bytes=pol.compute_bytes, vocab_rank=vocab_rank,
            grads_during_fwd=grads_during_fwd, last=last, checkpointing=t.gradient_checkpointing)
        results.append((peak, moments, host, nvme, managed, lay))

    peak, moments, host, nvme, managed, layout = max(results, key=lambda x: x[0].total)
    communicators = (1 if dp > 1 else 0) + (1 if tp > 1 else 0) + (1 if pp > 1 else 0)
    assumptions.extend(_train_assumptions(s, m, attention, pol, framework))
    return TrainResult(moments, peak, host, nvme, managed, communicators, list(dict.fromkeys(assumptions)), layout)


def _dora_saved(m: ModelSpec, tgt: frozenset[str], rank: int, x_bytes: int, tp: int) -> tuple[int, int]:
    """DoRA's saved tensors per layer: (per token, constant), from peft's ``DoraLinearLayer.forward``.

    Per target and token: the base output and the LoRA output, each saved by its multiplication
    with the magnitude scale (2 c out).  Constant per target: the identity ``x_eye [in, in]`` pushed
    through lora_A to form the low-rank weight, saved by lora_A (and its output [in, r] by lora_B),
    in the adapter input's dtype (the compute dtype under autocast).
    """
    per_tok = const = 0
    for p in m.params:
        if not (p.layer_span and p.module in tgt and p.in_features and p.role == "linear"):
            continue
        n = p.count // len(p.layer_span)
        out = ceil_div(p.out_features, tp) if p.tp == "column" else p.out_features
        fan_in = ceil_div(p.in_features, tp) if p.tp == "row" else p.in_features
        per_tok += n * 2 * x_bytes * out
        const += n * x_bytes * fan_in * (fan_in + rank)
    return per_tok, const


def _down_grad_bytes(m: ModelSpec, layer: object, layer_grad: int, peft: object, lt: LoraTargets,
                     rp: RankParams, j: int, tp: int = 1, ep: int = 1) -> int:
    """The share of a layer's gradient that belongs to its MLP's output projection (the experts'
    down projections for MoE): the gradient the MLP's backward produces first.  Adapters: the whole
    layer's (small), but for the fused experts' adapters (``ParamWrapper``), which are not small: only
    the down projection's are made by then."""
    from vramplan.spec.model import LayerSpec

    assert isinstance(layer, LayerSpec)
    h = m.hidden_size
    n_attn = h * (2 * m.q_width + 2 * m.kv_width)
    if peft is not None:
        lora_layer = rp.lora_per_layer[j] if j < len(rp.lora_per_layer) else 0
        if layer.moe and m.moe is not None and lt.experts_wrapped and lora_layer:
            e = m.moe
            inter = e.expert_intermediate_size if ep > 1 else ceil_div(e.expert_intermediate_size, tp)
            down_adapters = lt.down_rank * ceil_div(e.num_experts, ep) * (m.hidden_size + inter)
            return layer_grad * min(down_adapters, lora_layer) // lora_layer
        return layer_grad
    if layer.moe and m.moe is not None:
        down = h * (m.moe.num_experts * m.moe.expert_intermediate_size + m.moe.shared_intermediate_size)
        n_mlp = 3 * down + h * m.moe.num_experts
    elif layer.intermediate_size:
        down = h * layer.intermediate_size
        n_mlp = (3 if m.mlp_gated else 2) * down
    else:
        return layer_grad
    total = n_mlp + n_attn
    return layer_grad * down // total if total else layer_grad


def _residual_bytes(pol: PrecisionPolicy, frozen_base: bool, kbit_prepared: bool) -> int:
    """The residual stream's dtype: the embeddings' output, kept by the residual adds (autocast leaves
    additions alone).  Under PEFT the frozen base, embeddings included, is loaded in the half dtype,
    unless ``prepare_model_for_kbit_training`` cast the non-quantized parameters to fp32."""
    if not frozen_base:
        return pol.residual_bytes
    return 4 if kbit_prepared else pol.frozen_param_bytes


def _one_layer(rp: RankParams, params: int) -> RankParams:
    from dataclasses import replace

    frac = params / rp.total if rp.total else 0
    return replace(rp, total=params, linear=int(rp.linear * frac), linear_out_features=int(
        rp.linear_out_features * frac), lm_head=0)


def _linear_params_per_layer(rp: RankParams, m: ModelSpec) -> int:
    """Decoder linear parameters per layer on this rank that autocast casts (layers of one stage are alike).

    Routed experts are left out: transformers >= 5 multiplies them with ``grouped_mm``, which is not
    on autocast's lists, so their fp32 weights are used as they are (no cached half copy).
    """
    if not rp.layers:
        return 0
    linear_all = sum(p.total for p in m.params if p.role in ("linear", "expert") and p.in_features)
    experts = sum(p.total for p in m.params if p.role == "expert" and p.in_features)
    cast = rp.linear - (rp.linear * experts // linear_all if linear_all else 0)
    return cast // len(rp.layers)


def _grad_bytes_layer(rp: RankParams, j: int, trainable: int, pol: PrecisionPolicy, shards: int,
                      peft: object) -> int:
    n = rp.lora_per_layer[j] if peft is not None else rp.per_layer[j]
    return ceil_div(n, shards) * pol.grad_bytes


def _adafactor_tensors(m: ModelSpec, rp: RankParams, tp: int, shards: int) -> list[tuple[int, int, int]]:
    """(elements, rows, columns) of this rank's parameters in the order Adafactor steps through them.

    The Trainer's groups (``get_decay_parameter_names``): the decay group (embeddings, linear
    weights, the LM head, in module order, layer by layer) then the no-decay group (norm weights
    and biases).  A weight [out, in] is factored into out rows and in columns; transformers 5
    stores a layer's routed experts as one [E, 2I, h] gate-up and one [E, h, I] down tensor.
    Vector parameters are not factored (0, 0).  Two layers are listed: the step's peak depends
    only on each tensor and the one before it.
    """
    layers = list(rp.layers)[:2]

    def shape(p: ParamGroup, n: int) -> tuple[int, int, int]:
        n = ceil_div(n, shards)
        if p.in_features and p.out_features and shards == 1:
            return n, n // p.in_features, n // p.out_features
        if p.role == "embedding" and shards == 1:
            return n, n // m.hidden_size, m.hidden_size
        return n, 0, 0

    def tp_numel(p: ParamGroup) -> int:
        return ceil_div(p.numel, tp) if p.tp in ("column", "row", "vocab") else p.numel

    decay: list[tuple[int, int, int]] = []
    no_decay: list[tuple[int, int, int]] = []
    pre = [p for p in m.params if not p.layer_span and p.role in ("embedding", "position")]
    post = [p for p in m.params if not p.layer_span and p not in pre]
    layered = [p for p in m.params if p.layer_span]
    if rp.has_embedding:
        decay += [shape(p, tp_numel(p)) for p in pre]
    for i in layers:
        gate_up = 0
        for p in layered:
            if i not in p.layer_span:
                continue
            if p.role in ("norm", "bias"):
                no_decay.append(shape(p, tp_numel(p)))
            elif p.role == "expert":
                n = tp_numel(p) * (p.count // len(p.layer_span))  # the layer's experts in one tensor
                if p.module in ("gate_proj", "up_proj") and m.mlp_gated:
                    gate_up += n
                    if gate_up == 2 * n:
                        decay.append((ceil_div(gate_up, shards), 0, 0) if shards > 1 else
                                     (gate_up, gate_up // p.in_features, gate_up // (2 * p.out_features)))
                else:
                    decay.append(shape(p, n))
            else:
                decay.append(shape(p, tp_numel(p)))
    for p in post:
        if p.role == "lm_head" and not rp.has_lm_head:
            continue
        (no_decay if p.role in ("norm", "bias") else decay).append(shape(p, tp_numel(p)))
    return decay + no_decay


def _adafactor_state(m: ModelSpec) -> int:
    """Adafactor state elements: rows + columns for each matrix, the full size for vectors."""
    total = 0
    for p in m.params:
        if p.in_features and p.out_features:
            total += (p.in_features + p.out_features) * p.count
        elif p.role in ("embedding", "position"):
            rows = p.numel // m.hidden_size
            total += (rows + m.hidden_size) * p.count
        else:
            total += p.total
    return total


def _train_assumptions(s: Scenario, m: ModelSpec, attention: str, pol: PrecisionPolicy, fw: str) -> list[str]:
    t = s.train
    out = [
        f"framework behaviour: {fw}",
        f"attention kernel: {attention} (as PyTorch SDPA would dispatch on the GPU)",
        "sequences are full length (no padding), so SDPA runs without an explicit mask",
        "loss as transformers >= 4.46 computes it (fp32 logits, log_softmax saved)",
        "steady-state step: optimizer states exist; gradients are set to None after each step",
        "NCCL 128 MiB per communicator",
    ]
    if t.attention == "sdpa" and m.model_type in NO_SDPA:
        out.append(f"{m.model_type} has no SDPA attention: transformers' default falls back to eager")
    if t.peft is not None and t.quantization in ("nf4", "nf4-dq", "fp4"):
        if s.software.bnb_4bit_saves_input:
            out.append(f"bitsandbytes {s.software.bitsandbytes} (< 0.43.2): each 4-bit linear keeps its input "
                       "for the backward (MatMul4Bit ctx.tensors = (A, B))")
        else:
            out.append("bitsandbytes >= 0.43.2: 4-bit linears keep no input for the backward "
                       "(set software.bitsandbytes for older versions, which kept it)")
    if t.optimizer == "adamw" and fw != "deepspeed":
        out.append("torch.optim.AdamW uses the foreach implementation (CUDA default): one state-sized "
                   "temporary for the weight-decay group during step()")
    if t.optimizer.startswith("paged"):
        out.append("paged optimizer states live in CUDA managed memory: outside max_memory_allocated, "
                   "counted in device_used while resident")
    if t.peft is not None:
        why = ("DeepSpeed's half module" if fw == "deepspeed" else
               f"peft {s.software.peft} gives adapters their base weight's dtype" if s.software.peft_adapters_in_base_dtype
               else "peft >= 0.12 upcasts adapters; set software.peft for older versions, which kept the base dtype")
        out.append(f"PEFT: frozen base weights stored in {pol.half if pol.half != 'fp32' else 'fp32'}, "
                   f"adapters in {'fp32' if pol.param_bytes == 4 else pol.half} ({why})")
        if t.quantization != "none":
            out.append("prepare_model_for_kbit_training casts non-quantized parameters (embeddings, norms, "
                       "LM head) to fp32")
    if m.moe is not None:
        if t.peft is not None and quantized_expert_loop(m, t.quantization):
            out.append("MoE experts quantized per expert by bitsandbytes and run one expert at a time, as "
                       "transformers 4.x loaded them (transformers 5 with stock bitsandbytes leaves its fused "
                       "experts unquantized, bitsandbytes issue #1849); routing is perfectly balanced")
        elif not s.software.fused_moe_experts:
            out.append(f"MoE experts as transformers {s.software.transformers} holds them: one nn.Linear MLP per "
                       "expert (LoRA: a lora.Linear per expert projection)")
        else:
            out.append("MoE experts run through transformers >= 5's grouped GEMMs (grouped_mm_experts_forward); "
                       "routing is perfectly balanced")
            lt = lora_targets(t.peft, m, True, t.quantization)
            if lt.experts_wrapped:
                out.append("LoRA on the fused experts through peft's ParamWrapper: each adapted expert stack "
                           "(W + s B A) is kept from the forward to the backward (as peft 0.21 does with transformers 5; "
                           "set software.transformers for 4.x's per-expert adapters)")
    return out
