"""GRPO's and RLOO's rollout by Hugging Face ``generate`` inside the trainer (``rl.rollout.engine: hf-generate``).

TRL (v1.9.0 and v1.16.0 alike) with ``use_vllm=False``: ``_generate_single_turn`` runs, under ``torch.no_grad()``,
``unwrap_model_for_generation(self.model_wrapped, ...)`` (``trl/models/utils.py``: gradient checkpointing disabled,
``accelerator.unwrap_model(model)``) and ``unwrapped_model.generate(**generate_inputs, generation_config=...)``
(``max_new_tokens = max_completion_length``, ``do_sample=True``, ``top_k=0``, ``top_p=1.0``) on the whole local
generation batch: ``per_device_train_batch_size x steps_per_generation`` prompts (``steps_per_generation`` defaults to
``gradient_accumulation_steps``; ``_prepare_inputs`` generates once per generation batch).  The HF Trainer calls
``_prepare_inputs`` before its loss context, but accelerate's ``prepare_model`` wrapped the model's ``forward`` in
autocast and ``convert_outputs_to_fp32`` and ``unwrap_model`` keeps that wrapper (``keep_fp32_wrapper=True``): every
forward of ``generate`` runs under the training's autocast.  So, with the policy's parameters resident:

* the call's own tensors as the inference engine counts them for the compute dtype (analytic/inference.py: the
  prompt's and then every token's KV cache, the running layer or the last-token logits with their fp32 copy and the
  sampling temporaries, the cache's growth), minus its weights and cuBLAS workspace (the trainer's are resident);
* with fp32 parameters under autocast (not a half PEFT base), the residual stream is fp32 (the embedding's output and the norms' outputs,
  as in the training step): the prefill's three ``b P H`` tensors the inference engine counts in the compute dtype
  (kept embeddings, residual, normalised input) counted at 4 bytes instead (an upper bound when the head's side is
  the prefill's larger); and RoPE's ``cos``/``sin`` come back in the residual's dtype (``rotary_emb(hidden_states,
  ...)`` returns ``cos.to(x.dtype)``), so ``apply_rotary_pos_emb`` promotes the bf16 keys to fp32 and the cache
  keeps fp32 keys beside bf16 values (a CPU run of transformers 5.24's Qwen2 under bf16 autocast: ``keys.dtype``
  float32, ``values.dtype`` bfloat16): the cache's keys, their growth and cos/sin counted at 4 bytes;
* accelerate's ``convert_outputs_to_fp32`` returns the last-token logits in fp32 before ``generate`` copies them to
  fp32 again (``outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)``): ``4 b V`` beside the inference
  engine's logits wherever they are part of the moment (autocast only);
* autocast's cached half copies of every trainable fp32 linear weight (torch ``cached_cast`` caches a leaf that
  requires grad, in ``no_grad`` too) until the forward's autocast region exits: at the head, every layer's and the
  head's copies (``terms/casts.py`` ``generate_casts_bytes``); a frozen fp32 base under PEFT is cast one linear at a
  time (not cached).

The phase adds all the copies to the call's highest moment: an upper bound, by at most the head's copy, since the
prefill's running layer comes before the head is cast and the sampling after the forward has dropped the copies.
"""

from __future__ import annotations

from vramplan.analytic.inference import inference_step
from vramplan.analytic.moment import K, Moment
from vramplan.analytic.terms.casts import generate_casts_bytes
from vramplan.analytic.terms.context import StepContext
from vramplan.errors import Problem
from vramplan.spec.defaults import completion_len
from vramplan.spec.load import Resolved
from vramplan.spec.model import ModelSpec
from vramplan.spec.scenario import Inference

__all__ = ["generation_batch", "hf_generate_notes", "hf_generate_parts", "hf_generate_problems"]

_CALL_KEYS = (K.PARAMETERS, K.CUBLAS)  # the call's weights and workspace: the trainer's, resident already
_KV_KEYS = (K.KV_PROMPT, K.KV_ALL, K.KV_LEGACY)


def generation_batch(c: StepContext) -> int:
    """Prompts per ``generate`` call on this GPU: ``per_device_train_batch_size x steps_per_generation``
    (``steps_per_generation`` = ``gradient_accumulation_steps``, TRL's default)."""
    t = c.s.train
    return t.micro_batch_size * t.grad_accum_steps


def hf_generate_problems(m: ModelSpec) -> list[Problem]:
    """Models whose generate cache under autocast this rollout does not model: a compressed (MLA) cache and a hybrid
    model's mixer state (their dtypes under autocast over fp32 weights not read)."""
    if m.mla is None and m.mamba is None:
        return []
    kind = "an MLA (compressed) KV cache" if m.mla is not None else "a hybrid model's Mamba2 state"
    return [Problem("rl.rollout.engine", f"hf-generate over {kind} ({m.name}) is not modelled",
                    "use rl.rollout.engine: vllm")]


def hf_generate_parts(c: StepContext, r: Resolved, batch: int | None = None) -> tuple[int, int, int]:
    """The ``generate`` call's (KV cache, other tensors, autocast weight copies) at its highest moment, beyond the
    policy's resident parameters (module docstring).  ``r`` is the policy's scenario (prompt + completion);
    ``batch``: prompts per call (None: GRPO's generation batch; PPO's ``local_rollout_forward_batch_size``)."""
    s, pol = c.s, c.pol
    ro = s.rl.rollout
    b, prompt = batch or generation_batch(c), ro.max_prompt_len
    inf = Inference(batch_size=b, prompt_len=prompt, new_tokens=completion_len(s), dtype=pol.half,
                    attention=s.train.attention)
    call = Resolved(s.model_copy(update={"task": "inference", "inference": inf}), r.model, r.gpu, ())
    # the residual stream's dtype as the step has it (fp32 over fp32 weights; a half PEFT base keeps it half)
    cb, up = pol.compute_bytes, c.act.residual_bytes
    fp32_residual = 3 * b * prompt * c.m.hidden_size * (up - cb)
    rope = c.m.position == "rope"

    def split(mo: Moment) -> tuple[int, int]:
        kv = sum(mo.get(k) for k in _KV_KEYS)
        other = mo.total - kv - sum(mo.get(k) for k in _CALL_KEYS)
        if rope:
            # keys (half of a K/V layer) at the residual's bytes; one layer's keys during the cache's torch.cat
            # and RoPE's cos/sin likewise
            kv = kv // 2 * up // cb + kv // 2
            other += (mo.get(K.CACHE_GROWTH) + mo.get(K.ROPE)) * (up - cb) // cb
        if pol.autocast and mo.get(K.LAST_LOGITS):
            other += 4 * b * c.m.vocab_size  # convert_outputs_to_fp32's copy of the last-token logits
        return kv, other + (fp32_residual if mo.phase == "prefill" else 0)

    kv, other = max((split(mo) for mo in inference_step(call).moments), key=sum)
    return kv, other, generate_casts_bytes(c)


def hf_generate_notes(c: StepContext, method: str) -> list[str]:
    """What the hf-generate rollout takes as given, for the report."""
    ro, pol = c.s.rl.rollout, c.pol
    how = (f"under {pol.half} autocast over the fp32 parameters (accelerate's forward wrapper), their half copies "
           "cached for each forward" if pol.autocast else f"in the parameters' {pol.half}")
    fp32 = (" the fp32 residual stream of the prompt and the cache's keys (RoPE's fp32 cos/sin promote them) counted "
            "at 4 bytes;" if c.act.residual_bytes > pol.compute_bytes else "")
    out = [(f"{method} rollout: Hugging Face generate inside the trainer (use_vllm=False, "
            f"unwrap_model_for_generation): {generation_batch(c)} prompts (per_device_train_batch_size x "
            f"steps_per_generation) of {ro.max_prompt_len} tokens, {completion_len(c.s)} new tokens each, in one "
            f"call, {how}; its KV cache, running layer and last-token logits as the inference engine counts them "
            f"(analytic/inference.py), every sequence at full length;{fp32} every cached weight copy added to the "
            "call's highest moment (an upper bound by at most the head's copy)"),
           (f"{method} rollout sampling: the inference engine's top-k/top-p temporaries (about 25 B per vocabulary "
            "entry) are counted although TRL's defaults (top_k=0, top_p=1.0) add no warper: an upper bound of a few "
            "MB")]
    if c.peft is not None and pol.autocast:
        out.append(f"{method} rollout under PEFT: autocast's cached half copies of the fp32 adapters (rank-sized) "
                   "are not counted")
    return out
