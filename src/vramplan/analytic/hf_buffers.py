"""Buffers that older transformers releases register when they build a model, on the GPU beside its parameters.

**Rotary caches** (``Traits.rope_cache_in``).  From Llama's first release (4.28) the rotary embedding built its cos
and sin tables for every position up to ``max_position_embeddings`` at construction and registered them as buffers,
and every attention layer built its own (``LlamaAttention._init_rope``); the later RoPE families copied the code.
Read off the release wheels:

* 4.28.1-4.30.2 ``LlamaRotaryEmbedding.__init__``: ``emb.cos()[None, None, :, :]`` from the fp32 ``inv_freq``, no
  cast: fp32 whatever the model's dtype (``Traits.rope_cache_fp32_before``);
* 4.31.0-4.37.2 ``_set_cos_sin_cache(seq_len=max_position_embeddings, dtype=torch.get_default_dtype())`` and
  ``register_buffer("cos_cached", emb.cos().to(dtype), persistent=False)`` (``sin_cached`` the same); 4.38.2-4.40.2
  ``_cos_cached``/``_sin_cached`` "for BC", still built in ``__init__``; 4.41.2: none.  ``from_pretrained`` builds
  the model under ``torch_dtype`` as the default dtype, so the tables take the dtype the model is loaded in;
* the same buffers, per attention layer, in Mistral 4.34-4.41, Mixtral 4.36-4.47, Qwen2 4.37-4.44, Qwen2-MoE
  4.40-4.44, StarCoder2 4.39-4.44 and Falcon's rotary configs 4.36-4.44 (4.33-4.35 cached only the running
  length); none of them in 4.45.2 (4.48.3 for Mixtral), where one model-level rotary embedding computes cos and sin
  per call.

Per layer: ``2 x max_position_embeddings x head_dim`` elements, plus ``inv_freq`` (``head_dim / 2`` fp32).
Mistral-7B (32,768 positions, head_dim 128, 32 layers) in bf16: 32 x (2 x 32,768 x 128 x 2 + 64 x 4) = 536,879,104 B;
Qwen2-7B (131,072 positions, 28 layers): 1.88 GB.

**Causal mask** (``Traits.causal_mask_buffer_in``): Llama and Gemma 4.38 register ``causal_mask`` =
``torch.triu(torch.full((P, P), True))`` with P = max_position_embeddings, one bool byte each, in ``LlamaModel.__init__``
/ ``GemmaModel.__init__`` (4.37.2 and 4.39.3 have none).  From it ``_update_causal_mask`` makes, at every forward,
``(batch, 1, P, P)`` in the embeddings' dtype, and each layer indexes a ``[batch, 1, s, s]`` slice (a copy:
``cache_position`` is a tensor) for eager and SDPA attention, so SDPA runs the memory-efficient kernel on a mask
(``spec/model.py`` ``for_release``: ``Traits.sdpa_mask_always`` for that release) and the 4-D mask lives through the
forward (terms/saved.py ``release_causal_mask``; inference.py ``CallTerms.release_mask``).

What dtype the tables end in: the default dtype at construction, then whatever casts the whole module: DeepSpeed's
``module.half()``/``bfloat16()`` (its bit16 module), FSDP1's ``MixedPrecision(buffer_dtype=...)`` as accelerate and
Lightning set it (the half dtype).  Buffers are neither sharded by ZeRO-3/FSDP nor offloaded: every rank holds its
layers' whole tables.  Frameworks that run their own model code (torchtitan, Lit-GPT, torchtune, Megatron-LM) and
the serving engines have none of these.
"""

from __future__ import annotations

from vramplan.spec.model import ModelSpec

__all__ = ["causal_mask_buffer_bytes", "hf_buffer_notes", "rope_cache_bytes", "rotary_tables_bytes"]


def _in(window: tuple[tuple[int, ...], tuple[int, ...]] | None, version: tuple[int, ...] | None) -> bool:
    return window is not None and version is not None and window[0] <= version < window[1]


def rope_cache_bytes(m: ModelSpec, version: tuple[int, ...] | None, layers: int, elem_bytes: int,
                     inv_freq_bytes: int = 4) -> int:
    """The rotary caches of ``layers`` attention layers under transformers ``version`` (0 outside the family's
    window, for a model without RoPE, or with no version given: the current release has none), ``elem_bytes`` the
    dtype the model was built in (fp32 before ``Traits.rope_cache_fp32_before``), ``inv_freq_bytes`` fp32's unless
    the whole module was cast (``inv_freq`` is built with ``.float()``).

    >>> from vramplan.catalog.models import load_model
    >>> rope_cache_bytes(load_model("mistralai/Mistral-7B-v0.1"), (4, 36, 2), 32, 2)
    536879104
    >>> rope_cache_bytes(load_model("mistralai/Mistral-7B-v0.1"), (4, 42), 32, 2)
    0
    """
    t = m.traits
    if m.position != "rope" or m.mla is not None or not _in(t.rope_cache_in, version):
        return 0
    assert version is not None
    if t.rope_cache_fp32_before is not None and version < t.rope_cache_fp32_before:
        elem_bytes = 4
    return rotary_tables_bytes(m, layers, elem_bytes, inv_freq_bytes)


def rotary_tables_bytes(m: ModelSpec, layers: int, elem_bytes: int, inv_freq_bytes: int = 4) -> int:
    """``layers`` rotary embeddings' cos and sin tables (max_position_embeddings x head_dim each, ``elem_bytes``) and
    their ``inv_freq`` (head_dim / 2, ``inv_freq_bytes``)."""
    d = m.head_dim
    return layers * (2 * m.max_position_embeddings * d * elem_bytes + d // 2 * inv_freq_bytes)


def causal_mask_buffer_bytes(m: ModelSpec, version: tuple[int, ...] | None) -> int:
    """transformers 4.38's ``causal_mask`` buffer of Llama and Gemma: P x P bools (0 in another release).

    >>> from vramplan.catalog.models import load_model
    >>> causal_mask_buffer_bytes(load_model("meta-llama/Llama-2-7b-hf"), (4, 38, 2))
    16777216
    """
    if not _in(m.traits.causal_mask_buffer_in, version):
        return 0
    return m.max_position_embeddings ** 2


def hf_buffer_notes(m: ModelSpec, version_text: str | None, version: tuple[int, ...] | None, rope: int, mask: int,
                    eager_or_sdpa: bool) -> list[str]:
    """The assumptions that name the buffers counted (none when there are none)."""
    notes: list[str] = []
    if rope:
        notes.append(f"transformers {version_text}: every attention layer of {m.family} registers rotary cos/sin "
                     f"buffers of max_position_embeddings ({m.max_position_embeddings:,}) positions at construction, "
                     f"{rope:,} B on this GPU (analytic/hf_buffers.py; none from the family's release without them)")
    if mask:
        notes.append(f"transformers {version_text}: {m.family}'s causal_mask buffer of {m.max_position_embeddings:,}^2 "
                     f"bools ({mask:,} B)")
        if eager_or_sdpa:
            notes.append(f"transformers {version_text}: _update_causal_mask repeats it over the batch in the embeddings' "
                         f"dtype at every forward, (batch, 1, {m.max_position_embeddings:,}, "
                         f"{m.max_position_embeddings:,}), and every layer takes a [batch, 1, s, s] slice of it: SDPA runs "
                         "the memory-efficient kernel on it (4.38 only; flash attention takes none)")
    return notes
