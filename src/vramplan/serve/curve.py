"""Concurrency against context length: how many requests of each length the KV cache holds.

vLLM sizes its KV pool once, at start-up, from what the profile run leaves; ``max_model_len`` does
not enter the profile (``serve/vllm.py`` ``_limits``: the profiled batch is ``max_num_batched_tokens``
and ``max_num_seqs``), so the pool is the same for every length, and the concurrency at a length is
the pool's blocks over the blocks one request of that length needs: the figure vLLM logs as
"Maximum concurrency for N tokens per request" (``get_max_concurrency_for_kv_cache_config`` in
vllm/v1/core/kv_cache_utils.py).  Each point is ``decide()`` run with ``serve.max_model_len`` set to
the length, so sliding-window and hybrid layers count exactly as in the start-up decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vramplan.errors import Problem, ScenarioError
from vramplan.serve.vllm import decide
from vramplan.spec.load import Resolved

__all__ = ["CurvePoint", "concurrency_curve", "default_lengths"]


@dataclass(frozen=True)
class CurvePoint:
    """Requests of ``context_len`` tokens the KV pool holds at once (vLLM's maximum concurrency)."""

    context_len: int
    max_concurrency: float
    kv_bytes_per_request: int


def default_lengths(max_len: int, smallest: int = 512) -> list[int]:
    """Powers of two from ``smallest`` up to ``max_len``, and ``max_len`` itself.

    >>> default_lengths(8192)
    [512, 1024, 2048, 4096, 8192]
    >>> default_lengths(5000)
    [512, 1024, 2048, 4096, 5000]
    """
    out = []
    n = smallest
    while n < max_len:
        out.append(n)
        n *= 2
    return [*out, max_len]


def concurrency_curve(r: Resolved, lengths: Sequence[int] | None = None) -> list[CurvePoint]:
    """One point per context length (default: ``default_lengths`` of the model's context length).

    vLLM's decision only: SGLang's pool does not depend on the context length (its concurrency at a
    length is ``max_total_num_tokens / length``, in ``serve --engine sglang``)."""
    if r.scenario.serve.engine != "vllm":
        raise ScenarioError([Problem("serve.engine", f"the concurrency curve is modelled for engine vllm only, "
                                     f"not {r.scenario.serve.engine}", "use engine vllm")])
    version = r.scenario.serve.vllm_version
    todo = list(lengths) if lengths else default_lengths(r.model.max_position_embeddings)
    out = []
    for n in todo:
        sv = r.scenario.serve.model_copy(update={"max_model_len": n})
        d = decide(Resolved(r.scenario.model_copy(update={"serve": sv}), r.model, r.gpu), version=version)
        # a hybrid model's request holds its blocks in every group (vLLM's start-up check may count fewer,
        # facts/vllm_releases.py MambaHybridRule.needed)
        per_request = d.layers_per_group * d.page_bytes * d.blocks_per_request if d.mamba_layers else d.needed_kv_bytes
        out.append(CurvePoint(n, round(d.max_concurrency, 4), per_request))
    return out
