"""Evaluation inside training: no-grad forwards over validation batches, kept logits, generation.

* **HF Trainer** (``Trainer.evaluation_loop``, transformers 4.41-4.57 ``trainer.py``): each batch runs
  ``prediction_step`` under ``torch.no_grad()``; its logits are gathered over the data-parallel ranks
  (``gather_function``: ``accelerator.gather_for_metrics``) and appended to ``all_preds``, an
  ``EvalLoopContainer`` that concatenates on the GPU (``nested_concat``: ``torch.cat`` of the kept logits
  and the new batch) until ``eval_accumulation_steps`` batches, when it moves them to the CPU
  (``to_cpu_and_numpy``).  ``Trainer.evaluate`` keeps no logits without a ``compute_metrics``
  (``prediction_loss_only=True if self.compute_metrics is None else None``).  No evaluation by default
  (``TrainingArguments.eval_strategy="no"``); ``per_device_eval_batch_size=8``.  Before 4.41 the loop did the
  same with ``preds_host = nested_concat(preds_host, logits)`` and ``_nested_gather`` (trainer.py 4.28).
* **Lit-GPT** (litgpt ``finetune/lora.py`` ``fit``: ``validate`` before training and every
  ``eval.interval`` steps, then ``generate_example``): validation forwards at the training micro-batch,
  then one sample generated with a KV cache for the model's whole ``max_seq_length``
  (``model.set_kv_cache(batch_size=1)``, "memory is not a concern here"), ``EvalArgs.max_new_tokens=100``.

A transformers model evaluated with ``use_cache`` on (terms/saved.py ``forward_use_cache``: the config's, which plain
loops and the 4.x HF Trainer leave as it is, the 5.x Trainer setting it from ``TrainingArguments.use_cache``, False
by default; ``eval_cache_bytes``) builds its cache in each evaluation forward: under ``model.eval()`` gradient checkpointing
does not turn it off (``if self.gradient_checkpointing and self.training``), and no backward frees the layers'
keys and values, so at the forward's end every layer's K/V of the batch is held by the output until
``prediction_step`` returns.

The no-grad forward's largest tensors are the head's (the logits, their fp32 copy and the loss's
log-softmax, as the step's loss makes them, scaled to the evaluation batch) or one MLP's (gate, up and
their product), whichever is larger, plus the residual stream in and out of a layer.
"""

from __future__ import annotations

from vramplan.analytic.events import StepLayout
from vramplan.analytic.inference import cache_bytes, litgpt_kv_bytes
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.ssm_state import ssm_state_bytes
from vramplan.analytic.terms.context import StepContext
from vramplan.analytic.terms.loss import (
    accelerate_converts_outputs,
    litgpt_head_dequant_bytes,
    standard_loss_tensors,
    unsloth_head,
    vocab_on_rank,
)
from vramplan.analytic.terms.saved import DYNAMIC_LAYER_COPIES_SINCE, forward_use_cache, separate_qkv
from vramplan.analytic.unsloth import unsloth_eval_head_bytes
from vramplan.facts.trainer_frameworks import trainer_framework
from vramplan.spec.scenario import Lifecycle
from vramplan.units import ceil_div

__all__ = ["eval_batch_size", "eval_batch_size_for", "eval_builds_cache", "eval_cache_bytes", "eval_cache_fused_views",
           "eval_forward_stream",
           "eval_generates", "eval_generates_for", "eval_runs", "eval_runs_for",
           "eval_seq_len", "evaluation_phase"]

HF_EVAL_BATCH = 8  # TrainingArguments.per_device_eval_batch_size
LITGPT_NEW_TOKENS = 100  # litgpt EvalArgs.max_new_tokens


def eval_runs_for(lc: Lifecycle, framework: str) -> bool:
    """Whether training evaluates: the scenario's setting, else only Lit-GPT's loop does by default.  The
    ``*_for`` functions take the settings alone, for the exporters (``export/lifecycle.py``)."""
    return lc.evaluation if lc.evaluation is not None else framework == "lightning"


def eval_batch_size_for(lc: Lifecycle, framework: str, micro_batch_size: int, raw_framework: str | None = None) -> int:
    """The evaluation batch: the scenario's, else the HF Trainer's ``per_device_eval_batch_size`` (8) or the
    other loops' training micro-batch (axolotl's too: ``raw_framework``, facts/trainer_frameworks.py)."""
    if lc.eval_batch_size is not None:
        return lc.eval_batch_size
    row = trainer_framework(raw_framework)
    if row is not None and row.eval_batch_is_micro_batch:
        return micro_batch_size
    return HF_EVAL_BATCH if framework == "hf-trainer" else micro_batch_size


def eval_generates_for(lc: Lifecycle, framework: str) -> int:
    """Tokens generated after each validation (0: none): the scenario's, else Lit-GPT's ``max_new_tokens``."""
    n = lc.eval_generate_tokens
    if n is not None:
        return n
    return LITGPT_NEW_TOKENS if framework == "lightning" else 0


def eval_runs(c: StepContext) -> bool:
    return eval_runs_for(c.s.lifecycle, c.framework)


def eval_batch_size(c: StepContext) -> int:
    return eval_batch_size_for(c.s.lifecycle, c.framework, c.s.train.micro_batch_size, c.s.framework)


def eval_generates(c: StepContext) -> int:
    """Tokens generated after each validation (0: none)."""
    return eval_generates_for(c.s.lifecycle, c.framework)


def eval_seq_len(c: StepContext) -> int:
    """Tokens per evaluation sequence: the scenario's ``lifecycle.eval_seq_len``, else the training length."""
    return c.s.lifecycle.eval_seq_len or c.s.train.seq_len


def _head_tensors(c: StepContext, lay: StepLayout) -> tuple[int, int, int]:
    """(logits, their fp32 copy, log-probs) of the training micro-batch.  A loss kernel (``train.loss``) is the
    training step's: outside training Liger's forward materializes the logits (``skip_logits`` is
    ``self.training and labels is not None``, Liger-Kernel v0.8.2 ``transformers/model/llama.py``), so the
    evaluation runs the standard loss (terms/loss.py ``standard_loss_tensors``)."""
    if c.s.train.loss == "standard":
        return lay.logits, lay.logits_fp32, lay.log_probs
    a, b, d = standard_loss_tensors(c).forward_tensors
    return a, b, d


def _forward_bytes(c: StepContext, lay: StepLayout, batch: int) -> int:
    """One no-grad forward's largest live tensors at ``batch`` sequences.  Lit-GPT's ``validate`` runs the head
    unchunked (``model(input_ids)``), its 4-bit head dequantized beside the logits (terms/loss.py
    ``litgpt_head_dequant_bytes``)."""
    # the head's tensors are the training micro-batch's (mb x seq_len tokens), scaled to the evaluation's
    # batch x eval_seq_len tokens
    seq, mb, es = c.s.train.seq_len, c.s.train.micro_batch_size, eval_seq_len(c)
    tokens = ceil_div(batch * es, c.s.parallel.cp)
    if c.s.software.unsloth is not None:
        head = _unsloth_head(c, batch)[0] if lay.has_head else 0
    else:
        head = sum(_head_tensors(c, lay)) * batch * es // (mb * seq) if lay.has_head else 0
    if c.litgpt_head:
        head = max(head, lay.logits * batch * es // (mb * seq) + litgpt_head_dequant_bytes(c))
    mlp = tokens * lay.inter * _linear_out_bytes(c, lay) * (3 if lay.gated else 2)
    return 2 * tokens * lay.hidden * lay.residual_bytes + max(head, mlp)


def eval_builds_cache(c: StepContext) -> bool:
    """Whether an evaluation forward builds transformers' cache: a decoder (an encoder has none; an encoder-decoder's
    evaluation is not modelled here) run with ``use_cache`` on (terms/saved.py ``forward_use_cache``: the
    scenario's, else the config's; off under TRL's SFTTrainer from 0.22).  Lit-GPT's and the other frameworks' own
    models build none in a forward."""
    m = c.m
    return forward_use_cache(c.s, m) and not m.encoder_only and m.encoder_decoder is None


def eval_cache_bytes(c: StepContext, lay: StepLayout, batch: int) -> int:
    """The cache one evaluation forward of ``batch`` sequences holds at its end (0 where none: ``eval_builds_cache``).

    Each attention layer's keys and values of every token, as a prefill's (analytic/inference.py ``cache_bytes``
    with ``prefill``: a sliding-window layer's view keeps the whole prompt's storage), at the query-head-grouped
    width the cache stores (4.36-4.55 the projected tensors themselves, 4.56 on ``DynamicLayer.update``'s copy,
    before 4.36 the ``(key, value)`` tuple), plus a hybrid model's mixer states (analytic/ssm_state.py
    ``ssm_state_bytes``).  The cache goes with the model output when ``prediction_step`` returns, before the logits
    are concatenated.

    Llama-2-7B (32 layers, 32 KV heads x 128, bf16: 2 x 32 x 4,096 x 2 B = 524,288 B per token), evaluation batch
    8 x 2,048 tokens: 524,288 x 16,384 = 8,589,934,592 B.

    The keys and values are in the projections' output dtype: over a k-bit base that peft's preparation left fp32
    under autocast, bitsandbytes' linears return their fp32 input's dtype (``Linear4bit.forward``:
    ``out.to(inp_dtype)``; the step's fp32 linear outputs, ``ActContext.elementwise_bytes``) and the attention
    updates the cache before any cast to the kernel's dtype (transformers 4.36-4.57 ``LlamaFlashAttention2`` and
    SDPA paths: ``past_key_value.update`` precedes the fp32 check), so the cache is fp32: twice the half figure."""
    if not eval_builds_cache(c):
        return 0
    tokens = ceil_div(eval_seq_len(c), c.s.parallel.cp)
    return cache_bytes(c.m, batch, tokens, _linear_out_bytes(c, lay), c.tp, "auto", True) + ssm_state_bytes(
        c.m, batch, lay.compute_bytes)


def _linear_out_bytes(c: StepContext, lay: StepLayout) -> int:
    """Bytes per element of a linear's output in an evaluation forward: fp32 over a prepared k-bit base under
    autocast (``eval_cache_bytes``), else the compute dtype."""
    return c.act.elementwise_bytes or lay.compute_bytes


def eval_cache_fused_views(c: StepContext) -> bool:
    """A fused q/k/v projection's evaluation cache before 4.56: its keys and values are views of the projection's
    output, which they keep alive whole: 1.5x the cache counted with GPT-2's ``c_attn(...).split`` (key and value
    views of the 3-wide output), 2x with GPT-NeoX's (4.28 ``modeling_gpt_neox.py``: the value a view of ``qkv``, the
    key a new ``torch.cat`` of its rotated part); not modelled (stated)."""
    tv = c.s.software.transformers_version
    return eval_builds_cache(c) and not separate_qkv(c.m) and tv is not None and tv < DYNAMIC_LAYER_COPIES_SINCE


def _unsloth_head(c: StepContext, batch: int) -> tuple[int, int]:
    """(head and loss bytes, logits returned) of Unsloth's no-grad forward of ``batch`` evaluation sequences
    (analytic/unsloth.py ``unsloth_eval_head_bytes``: Cut Cross-Entropy or not by the batch's tokens; the logits fp32
    after accelerate's conversion, none where Cut Cross-Entropy runs)."""
    tokens = ceil_div(batch * eval_seq_len(c), c.s.parallel.cp)
    return unsloth_eval_head_bytes(c.s, c.m.family, unsloth_head(c, tokens), c.gpu.cuda_capability)


def _kept_logits(c: StepContext, lay: StepLayout, batch: int) -> tuple[int, int]:
    """(logits kept while the last batch's forward runs, kept logits at the last concatenation)."""
    lc = c.s.lifecycle
    if not (lc.eval_keeps_logits and lay.has_head and c.framework == "hf-trainer"):
        return 0, 0
    t = c.s.train
    if c.s.software.unsloth is not None:
        per = _unsloth_head(c, batch)[1] * c.s.data_parallel_degree
    else:
        logits = _head_tensors(c, lay)[0]
        elements = c.tokens * vocab_on_rank(c)
        if accelerate_converts_outputs(c) and logits < 4 * elements:
            # the logits the loop keeps are accelerate's fp32 copy of half ones (terms/loss.py)
            logits = 4 * elements
        per = logits * batch * eval_seq_len(c) // (t.micro_batch_size * t.seq_len) * c.s.data_parallel_degree
    n = min(lc.eval_batches, lc.eval_accumulation_steps or lc.eval_batches)
    # the n-th add: n - 1 kept, the new batch, and their torch.cat (n batches) alive together
    return (n - 1) * per, (2 * n if n > 1 else 1) * per


def _generation_bytes(c: StepContext, lay: StepLayout) -> int:
    """Lit-GPT's sample generation: a batch-1 KV cache over ``max_seq_length`` (the training sequence
    length) in every layer of this rank, and one position's logits.

    Under lightning the cache is Lit-GPT's (``model.set_kv_cache(batch_size=1)`` in ``validate``, lit-gpt
    8641822): K and V expanded to every query head unless the model is multi-query (analytic/inference.py
    ``litgpt_kv_bytes``), beside ``mask_cache``, a ``max_seq_length`` x ``max_seq_length`` bool ``torch.tril``;
    the prompt's forward dequantizes a 4-bit head (``litgpt_head_dequant_bytes``).

    Under a mixed precision Lit-GPT makes the cache in fp32: ``set_kv_cache`` runs under ``fabric.init_tensor()``,
    which Fabric's ``MixedPrecision`` leaves a ``nullcontext()``, and ``KVCache`` is given no dtype
    (``torch.zeros(k_shape, dtype=None)``: the default fp32); its ``forward`` then converts each layer's buffers to
    the activations' dtype (``self.k = self.k.to(k.dtype)``) at that layer's first use, so the peak is the fp32
    cache and the first layer's half K (lit-gpt 8641822 ``finetune/lora.py`` ``validate``, ``lit_gpt/model.py``
    ``KVCache``; litgpt v0.5.0 the same)."""
    if not eval_generates(c):
        return 0
    seq, cb = c.s.train.seq_len, lay.compute_bytes
    if c.framework == "lightning" and c.m.num_layers:
        layers = len(lay.layers)
        if c.s.train.precision in ("bf16-mixed", "fp16-mixed"):
            half_k = litgpt_kv_bytes(c.m, 1, seq, cb, c.tp) // c.m.num_layers // 2
            cache = litgpt_kv_bytes(c.m, 1, seq, 4, c.tp) * layers // c.m.num_layers + half_k + seq * seq
        else:
            cache = litgpt_kv_bytes(c.m, 1, seq, cb, c.tp) * layers // c.m.num_layers + seq * seq
        return cache + c.m.vocab_size * cb + litgpt_head_dequant_bytes(c)
    cache = 2 * len(lay.layers) * lay.kv_width * seq * cb
    return cache + c.m.vocab_size * cb


def eval_forward_stream(c: StepContext, lay: StepLayout) -> tuple[int, ...]:
    """One evaluation forward's allocations in order, as a compact stream (``vramplan.alloc.compact``: ``n > 0``
    allocates, ``-i - 1`` frees this stream's ``i``-th allocation), for the allocator replay that follows the
    training steps (``analytic/allocator.py`` ``reserved_after_step``): the embedding's output; per layer its keys
    and values kept in the cache (``eval_cache_bytes`` split evenly over the layers' K and V), the MLP's
    intermediates, the layer's output beside its input, then the intermediates and the input freed; then the kept
    logits, the final norm's output and the head's tensors (``_forward_bytes``: two residual tensors and the larger
    of the MLP's and the head's).  Its highest point is the forward moment of ``evaluation_phase`` less what is
    resident: ``_forward_bytes`` plus the cache and the kept logits (Unsloth's and Lit-GPT's heads, computed
    otherwise, are left out here: the phase's packing still counts them)."""
    batch = eval_batch_size(c)
    tokens = ceil_div(batch * eval_seq_len(c), c.s.parallel.cp)
    seq, mb, es = c.s.train.seq_len, c.s.train.micro_batch_size, eval_seq_len(c)
    out: list[int] = []
    made = [0]

    def alloc(nbytes: int) -> int:
        out.append(max(nbytes, 1))
        made[0] += 1
        return made[0] - 1

    resid = tokens * lay.hidden * lay.residual_bytes
    layers = max(1, len(lay.layers))
    cache = eval_cache_bytes(c, lay, batch)
    kv = cache // (2 * layers)
    mlp = tokens * lay.inter * _linear_out_bytes(c, lay)
    cur = alloc(resid)
    for i in range(layers):
        if cache:
            alloc(kv)
            alloc(kv if i < layers - 1 else cache - kv * (2 * layers - 1))
        inter = [alloc(mlp) for _ in range(3 if lay.gated else 2)]
        nxt = alloc(resid)
        out.extend(-j - 1 for j in inter)
        out.append(-cur - 1)
        cur = nxt
    kept = _kept_logits(c, lay, batch)[0]
    if kept:
        alloc(kept)
    if lay.has_head and c.s.software.unsloth is None and not c.litgpt_head:
        alloc(resid)  # the final norm's output beside the last layer's
        for t in _head_tensors(c, lay):
            if t:
                alloc(t * batch * es // (mb * seq))
    return tuple(out)


def evaluation_phase(c: StepContext, lay: StepLayout, resident: Moment) -> Moment:
    """The evaluation's highest moment: the forward of its last batch (with the cache it builds), the last
    concatenation of kept logits, or the generation, over what stays resident between steps."""
    batch = eval_batch_size(c)
    kept_fwd, kept_cat = _kept_logits(c, lay, batch)
    fwd = resident.copy("evaluation").add(K.EVAL_FORWARD, _forward_bytes(c, lay, batch)).add(K.EVAL_LOGITS, kept_fwd)
    fwd.add(K.EVAL_CACHE, eval_cache_bytes(c, lay, batch))
    cat = resident.copy("evaluation").add(K.EVAL_LOGITS, kept_cat)
    gen = resident.copy("evaluation").add(K.EVAL_GENERATION, _generation_bytes(c, lay))
    return max((fwd, cat, gen), key=lambda mo: mo.total)
