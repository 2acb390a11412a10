"""Saved activations: what the forward keeps for the backward, and when the backward frees it.

Each layer's ``kept`` tensors (analytic/terms/layers.py) live from the forward to the end of that
layer's backward.  Checkpointing recomputes the rest (``full - kept``) when the layer's backward
comes: the whole layer with full checkpointing (alive through both parts), only the attention core
with attention-core (alive in the attention part); op-sac reruns the whole layer.  By the MLP's elementwise backward the output
projection's backward has freed its input; the attention's backward comes after the MLP's (and the
post-attention norm's) saved tensors are released: those frees are release terms (negative bytes).
1F1B keeps up to pp micro-batches in flight on the first stage (arXiv 2104.04473 sec. 2.2), GPipe all of the
step's, interleaved 1F1B torch's warmup + 1 chunk-micro-batches (facts/pipeline_schedules.py): the other
micro-batches' saved tensors stay through this one's backward (``StepContext.in_flight_bytes``).
"""

from __future__ import annotations

from collections.abc import Sequence

from vramplan.analytic import activations as act
from vramplan.analytic.attention import sdpa_repeats_kv
from vramplan.analytic.checkpointing import checkpoint_policy
from vramplan.analytic.hf_buffers import causal_mask_buffer_bytes
from vramplan.analytic.inference import cache_bytes
from vramplan.analytic.kv_cache import attention_layers
from vramplan.analytic.logits import next_power_of_2
from vramplan.analytic.moment import K
from vramplan.analytic.terms.base import Term, device_terms
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.layers import layer_activations
from vramplan.analytic.timeline import FORWARD, LOSS, TIED_EMBEDDING, Loc, attention, layer_done, mlp
from vramplan.facts.transformers import OWN_MODEL_FRAMEWORKS
from vramplan.facts.trl import SFT_USE_CACHE_OFF_SINCE, TRL_GC_NO_CACHE
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Scenario

__all__ = [
    "DYNAMIC_LAYER_COPIES_SINCE",
    "HF_TRAINER_USE_CACHE_ARG_SINCE",
    "attention_only_decoder",
    "cache_in_training_forward",
    "copying_training_cache",
    "default_use_cache",
    "forward_use_cache",
    "fused_cache_unmodelled",
    "head_saved",
    "layer_saved",
    "release_causal_mask",
    "rotary_layer_copies",
    "separate_qkv",
    "shared_saved",
    "training_cache",
    "training_cache_bytes",
    "use_cache_off_by",
]

# transformers 4.56.0 ``DynamicLayer.update`` (PR #40039): ``self.keys = torch.cat([self.keys, key_states])`` onto the
# empty tensor of ``lazy_initialization``, a copy; 4.55.4's ``DynamicCache.update`` appended the tensor itself
DYNAMIC_LAYER_COPIES_SINCE = (4, 56)
# transformers 5.0.0 adds TrainingArguments.use_cache (default False), which the Trainer writes to the model's config
HF_TRAINER_USE_CACHE_ARG_SINCE = (5, 0)


def layer_saved(c: StepContext) -> list[Term]:
    """Per layer: the kept tensors, the recomputed ones, the frees before each backward part; the
    other micro-batches in flight."""
    la = layer_activations(c)
    kept, ckpt = la.kept, checkpoint_policy(c.s)
    # attention-core recomputes only the attention core; full and op-sac rerun the whole layer's forward
    selective = ckpt == "attention-core"
    in_flight = c.in_flight_bytes(kept)
    offload = c.s.train.activation_offload == "cpu"
    out = device_terms(K.SAVED, [(kept[j], mlp(j) if offload else FORWARD, layer_done(j), "saved.kept", j)
                                 for j in range(len(kept))])
    out.append(Term(K.SAVED, in_flight, FORWARD, TIED_EMBEDDING, "saved.in_flight"))
    if offload:
        out.append(offloaded_inputs(kept))
    if la.host:
        # DeepSpeed partition+cpu: the checkpointed inputs' slices wait in host memory
        out.append(Term(K.SAVED, la.host, FORWARD, TIED_EMBEDDING, "saved.host_checkpointed", where="host"))
    below = [0]  # below[j + 1]: kept bytes of layers 0..j
    for k in kept:
        below.append(below[-1] + k)
    rows: list[tuple[int, Loc, Loc, str, int]] = []
    for j in range(len(kept) - 1, -1, -1):
        alive = (kept[j] if offload else below[j + 1]) + in_flight
        recompute = la.full[j] - kept[j] if ckpt != "none" else 0
        at_mlp, at_attention, done = mlp(j), attention(j), layer_done(j)
        rows += [
            (recompute, at_attention if selective else at_mlp, done, "saved.recompute", j),
            (-min(la.mlp_released[j], alive + recompute), at_mlp, at_attention, "saved.freed_before_mlp", j),
            (-min(la.released[j], alive + recompute), at_attention, done, "saved.freed_before_attention", j),
        ]
    return out + device_terms(K.SAVED, rows)


def offloaded_inputs(kept: Sequence[int]) -> Term:
    """Activation offloading (``train.activation_offload: cpu``) of the checkpointed layer inputs, in host memory.

    torchtune v0.6.1 ``OffloadActivations.pack_tensor`` (TRL v1.9.0 the same) copies every saved tensor of
    1024 bytes or more to ``torch.empty_like(..., pin_memory=True, device="cpu")`` on a side stream.  With full
    checkpointing a layer saves only its input (torch's non-reentrant checkpoint saves it through
    ``_NoopSaveInputs``, under the offloading hooks).  The GPU copy stays in the forward stash until 5 later
    tensors have been packed (``max_fwd_stash_size=5``): the final norm's and the loss's saved tensors come
    after the last layer's input, so by the loss no layer input is left on the GPU (those last tensors stay:
    the head's and loss's terms, unchanged).  In the backward each input is brought back when its layer's
    recompute unpacks it, and freed once the next node's hook runs: a layer input is on the GPU from its layer's
    backward to that backward's end (the ``saved.kept`` term, born at the layer's backward).

    Pinned memory comes from PyTorch's CachingHostAllocator, which rounds each request up to a power of two
    (aten/src/ATen/core/CachingHostAllocator.h ``allocate``: ``c10::llvm::PowerOf2Ceil(size)``).  Example,
    Llama-3-8B, 1 x 2048 tokens, fp32 residual: 2048 x 4096 x 4 = 33,554,432 B per layer, already 2^25."""
    return Term(K.SAVED, sum(next_power_of_2(k) for k in kept if k), FORWARD, TIED_EMBEDDING, "saved.offloaded",
                where="host")


def shared_saved(c: StepContext) -> list[Term]:
    """RoPE cos/sin, the eager mask, the embedding dropout mask: kept until the first layer's backward ends."""
    return [Term(K.SAVED, layer_activations(c).shared, FORWARD, TIED_EMBEDDING, "saved.shared")]


def rotary_layer_copies(c: StepContext) -> list[Term]:
    """Each layer's own RoPE cos and sin (``Traits.rotary_per_layer_copy``, GLM): ``repeat_interleave`` makes them
    from the shared pair in every layer's ``apply_rotary_pos_emb``, and ``q_rot * cos`` and ``rotate_half(q_rot) *
    sin`` save them for q's (and k's) gradient.  Per position, not per token (``position_ids`` has batch 1): 2 x the
    rotated dims x the position embeddings' dtype (the residual's: ``cos.to(x.dtype)``) x the sequence.  A layer
    that runs checkpointed (``LayerActivations.checkpointed``: full, every n-th layer, op-level SAC) keeps them only from
    its recompute, in its backward, to that backward's end.  Example, GLM-4-9B (rot 64) under bf16 mixed precision at 4,096 positions: 2 x 64 x 4 x 4,096 = 2,097,152 B
    per layer."""
    m = c.m
    if not m.traits.rotary_per_layer_copy or m.position != "rope":
        return []
    per = 2 * int(m.head_dim * m.partial_rotary_factor) * c.act.residual_bytes * c.act.seq_len
    la = layer_activations(c)
    recomputed = la.checkpointed or (False,) * len(la.kept)  # per layer: every n-th under full, all under op-sac
    return device_terms(K.SAVED, [(per, mlp(j) if recomputed[j] else FORWARD, layer_done(j), "saved.rotary", j)
                                  for j in range(len(la.kept) - 1, -1, -1)])


def release_causal_mask(c: StepContext) -> list[Term]:
    """transformers 4.38's 4-D mask (Llama, Gemma; eager and SDPA): ``_update_causal_mask`` repeats the P x P
    ``causal_mask`` buffer over the batch and converts it to the embeddings' dtype, ``(b, 1, P, P)`` with P =
    max_position_embeddings (modeling_llama.py 4.38.2 ``self.causal_mask[None, None, :, :].repeat(batch_size, 1, 1,
    1).to(dtype) * min_dtype``), which every layer indexes.  The decoder's forward holds it until it returns; a
    checkpointed layer keeps its inputs for the recompute, so with checkpointing it lives to the first layer's
    backward.  The repeat's bool and the product's first operand are transients of the forward's start, left out."""
    s = c.s
    # Unsloth's patched model drops the attention mask in training (``LlamaModel_fast_forward``: ``elif
    # self.training: attention_mask = None``, unsloth 2024.5)
    if (c.stage != 0 or c.framework in OWN_MODEL_FRAMEWORKS or c.act.attention == "flash"
            or s.software.unsloth is not None
            or not causal_mask_buffer_bytes(c.m, s.software.transformers_version)):
        return []
    residual = c.act.residual_bytes
    nbytes = s.train.micro_batch_size * c.m.max_position_embeddings ** 2 * residual
    dies = LOSS if s.train.gradient_checkpointing in ("none", None) else TIED_EMBEDDING
    return [Term(K.RELEASE_MASK, nbytes, FORWARD, dies, "saved.release_mask")]


def forward_use_cache(s: Scenario, m: ModelSpec) -> bool:
    """Whether the supervised step's forwards (training and evaluation) run transformers' own model with
    ``use_cache`` on: ``Train.use_cache``, null: the config's, except under TRL's SFTTrainer from 0.22, whose
    ``compute_loss`` passes ``use_cache=False`` to every forward (facts/trl.py ``SFT_USE_CACHE_OFF_SINCE``)."""
    t = s.train
    if t.objective != "sft" or s.effective_framework in OWN_MODEL_FRAMEWORKS or s.effective_framework in (
            "verl", "openrlhf"):
        return False
    if use_cache_off_by(s) == "trl":
        return False
    if t.use_cache is not None:
        return t.use_cache
    return default_use_cache(s, m)


def use_cache_off_by(s: Scenario) -> str | None:
    """What turns ``use_cache`` off for a supervised step whatever the model's config (None: nothing): "trl" (TRL's
    SFTTrainer from 0.22 passes False to every forward, even against ``train.use_cache``), "trainer" (the HF Trainer
    from transformers 5.0, a null ``train.use_cache``) or "trl-load" (TRL 0.15-0.16 under gradient checkpointing, a
    null ``train.use_cache``); ``default_use_cache`` gives the sources."""
    fw, tf, trl = s.effective_framework, s.software.transformers_version, s.software.trl_version
    if fw != "hf-trainer":
        return None
    if trl is not None and trl >= SFT_USE_CACHE_OFF_SINCE:
        return "trl"
    if s.train.use_cache is not None:
        return None
    if tf is None or tf >= HF_TRAINER_USE_CACHE_ARG_SINCE:
        return "trainer"
    if (trl is not None and TRL_GC_NO_CACHE[0] <= trl < TRL_GC_NO_CACHE[1]
            and s.train.gradient_checkpointing not in ("none", None)):
        return "trl-load"
    return None


def default_use_cache(s: Scenario, m: ModelSpec) -> bool:
    """``use_cache`` when the scenario leaves it null: the model config's, except where the trainer sets the config
    (``use_cache_off_by``).

    * The HF Trainer from transformers 5.0 sets ``model.config.use_cache = self.args.use_cache`` at its
      ``__init__`` and ``TrainingArguments.use_cache`` defaults to False (5.0.0 trainer.py:755, training_args.py:1418;
      5.24 trainer.py:646; 4.57.3 has neither): no cache in its forwards, training or evaluation, for a release from
      5.0 or the current one.
    * TRL 0.15-0.16's SFTTrainer builds a model it is given by name with ``use_cache=False`` under gradient
      checkpointing (``model_init_kwargs["use_cache"] = False``, v0.15.0 sft_trainer.py:270-272; commented out from
      0.17.0), taken here as the way its scripts run it."""
    return False if use_cache_off_by(s) is not None else m.config_use_cache


def cache_in_training_forward(s: Scenario, m: ModelSpec) -> bool:
    """Whether the training forward runs with ``use_cache`` on (``forward_use_cache``), through transformers' own
    model and the HF Trainer's supervised step, without gradient checkpointing (which turns it off in training:
    ``if self.gradient_checkpointing and self.training``); whether it builds a cache then depends on the model too
    (``attention_only_decoder``).  Unsloth's patched model turns it off in training (``LlamaModel_fast_forward``:
    ``if past_key_values is None and self.training: use_cache = False``, unsloth 2024.5)."""
    return (forward_use_cache(s, m) and s.train.gradient_checkpointing in ("none", None)
            and s.software.unsloth is None)


def training_cache_bytes(c: StepContext) -> int:
    """The keys and values the training forward's cache holds beyond what the attention keeps (0 where none).

    With ``use_cache`` on (``Train.use_cache``, null: the config's) and no gradient checkpointing (which turns it
    off), transformers builds a ``DynamicCache`` in the training forward (5.24 ``LlamaModel.forward``: ``if
    use_cache and cache is None: cache = DynamicCache(config=self.config)``), and each attention runs on what
    ``cache.update`` returns: from 4.56 a copy (``DynamicLayer.update``: ``torch.cat`` onto an empty tensor), which
    then replaces the projected keys and values (freed), before 4.56 those tensors themselves.  Either way the
    kernel keeps the cache's own tensors, so the cache adds nothing, except where the kernel is handed K/V repeated
    to every query head (eager attention, SDPA before 4.54: ``sdpa_repeats_kv``): the repeated copies are what the
    kernel keeps, and the cache holds the grouped ones, as after a prefill of the micro-batch (inference.py
    ``cache_bytes``), until the loss is returned (measured on the traced engine, tests/test_training_cache.py)."""
    s, m = c.s, c.m
    t = s.train
    if not cache_in_training_forward(s, m) or not attention_only_decoder(m) or c.stage != 0:
        return 0
    grouped = 1 < m.num_kv_heads < m.num_attention_heads and m.mla is None and separate_qkv(m)
    repeated = c.act.attention == "eager" or (t.attention == "sdpa" and sdpa_repeats_kv(s, m))
    if not (grouped and repeated):
        return 0
    return cache_bytes(m, t.micro_batch_size, t.seq_len, c.pol.compute_bytes, c.tp, "auto", True)


def attention_only_decoder(m: ModelSpec) -> bool:
    """A decoder whose layers all keep keys and values: the models whose training forward builds the cache counted
    here.  A hybrid or recurrent model's mixers update their cache in place during the forward, which its backward
    then refuses (``one of the variables needed for gradient computation has been modified by an inplace operation``,
    transformers 5.24 on Falcon-H1, LFM2, Zamba2, RWKV), so its training runs have none; an encoder or
    encoder-decoder model builds no such cache."""
    return (m.mamba is None and not m.traits.state_argument and m.encoder_decoder is None and not m.encoder_only
            and len(attention_layers(m)) == m.num_layers)


def separate_qkv(m: ModelSpec) -> bool:
    """Separate q, k and v projections (Llama's): the cache's tensors then stand in for the projected ones.  A fused
    projection's k and v are views of one buffer that a view of q (GPT-2's ``c_attn`` split) or of v (GPT-NeoX,
    Phi-3: ``Traits.fused_qkv_view``) keeps alive, so the cache's copies come on top of it or release it: not
    modelled (the report says so, ``fused_cache_unmodelled``)."""
    return len(m.traits.qkv_modules) == 3 and not m.traits.fused_qkv_view


def fused_cache_unmodelled(c: StepContext) -> bool:
    """A fused-projection model whose training forward copies K/V into its cache (4.56 on, use_cache on, no
    checkpointing): what the copies add or release is not modelled (``separate_qkv``)."""
    return copying_training_cache(c.s, c.m) and not separate_qkv(c.m)


def copying_training_cache(s: Scenario, m: ModelSpec) -> bool:
    """A training forward that builds a cache of copies (4.56 on, or the current release; the traced engine runs it)."""
    tv = s.software.transformers_version
    return (cache_in_training_forward(s, m) and attention_only_decoder(m)
            and (tv is None or tv >= DYNAMIC_LAYER_COPIES_SINCE))


def training_cache(c: StepContext) -> list[Term]:
    """The training forward's cache (``training_cache_bytes``), built layer by layer and held by the model output:
    the HF Trainer's ``compute_loss`` returns the loss alone, so the output goes before the backward."""
    return [Term(K.TRAIN_CACHE, nbytes, FORWARD, LOSS, "saved.train_cache")] if (
        nbytes := training_cache_bytes(c)) else []


def head_saved(c: StepContext) -> list[Term]:
    """The final norm's saved tensors and the LM head's input, freed by the head's backward."""
    if not c.last:
        return []
    m, ctx = c.m, c.act
    # Liger's and CCE's kernels take the head's weight and the hidden states themselves: no nn.Linear saves
    # the head's input (what they keep is their loss term's, terms/loss.py)
    # Lit-GPT's 4-bit head under bitsandbytes < 0.43.2 keeps its input too (MatMul4Bit ctx.tensors = (A, B))
    kbit_head = bool(c.litgpt_head) and c.act.kbit_saves_input
    head_input = (c.peft is None or kbit_head) and c.s.train.loss not in ("liger-fused-linear-ce", "cut-cross-entropy")
    nbytes = (act.norm_saved_per_token(m, ctx) + (c.pol.compute_bytes * m.hidden_size if head_input else 0)) * c.tokens
    return [Term(K.SAVED, nbytes, FORWARD, mlp(len(c.layer_specs) - 1), "saved.head")]
