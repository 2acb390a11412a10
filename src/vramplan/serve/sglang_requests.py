"""SGLang's request-to-token table and running-request limit at start-up, by release, read in the wheels' source.

After the KV pool is sized, SGLang decides how many requests may run at once (``max_num_reqs``) and allocates the
``ReqToTokenPool``: ``rows x (context_len + extra)`` int32 (``mem_cache/memory_pool.py`` ``ReqToTokenPool.__init__``:
``torch.zeros((size, max_context_len), dtype=torch.int32)``), from the reserve outside ``mem_fraction_static``.
How the three figures are set changed four times (``REQ_RULES``):

* 0.4.0: ``max_num_reqs`` = the given ``--max-running-requests``, else ``min(max(int(tokens / context_len x 512),
  2048), 4096)`` from the profiled tokens; the table holds ``max_num_reqs + 1`` rows; the scheduler runs
  ``min(tokens // 2`` (given: ``given // dp``), ``rows)`` requests (``managers/tp_worker.py``).
* 0.4.7: the table holds ``max_num_reqs`` rows (the logs' 2049 running requests become 2048).
* 0.5.1: with speculative decoding each row is ``speculative_num_draft_tokens`` wider ("temporary fix for the
  context length issue when using speculative decoding").
* 0.5.10: ``_resolve_max_num_reqs`` (``model_runner_kv_cache_mixin.py``) sizes the table from the page-aligned
  capacity: ``estimated = max(min(int(capacity / context_len x 512), 4096), 2048)``; given: ``min(given // dp,
  estimated)``; else ``min(estimated, capacity // 2)``; the table has that many rows and the scheduler runs that
  many (a small pool gets a smaller table, a given limit above the estimate is lowered to it).
* 0.5.14: a given limit is capped by ``capacity // 2`` instead of the estimate.
* 0.5.23: a given limit below the DP size leaves each DP rank one request (``max(1, given // dp)``); before, it
  leaves none and start-up fails on ``assert max_running_requests > 0, "max_running_request is zero"``
  (``managers/tp_worker.py``, 0.4.7 on).

The CUDA graphs of the decode batch are captured only for batch sizes up to the table's rows
(``model_executor/cuda_graph_runner.py`` ``get_batch_sizes_to_capture``: ``bs <= req_to_token_pool.size``, the
rows added when the largest size exceeds them; 0.4.1 to 0.5.23).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["REQ_RULES", "ReqRule", "RequestPool", "captured_graph_bs", "req_rule_for", "request_pool"]

Resolve = Literal["tp_worker", "estimated_cap", "capacity_cap"]


def _v(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


@dataclass(frozen=True)
class ReqRule:
    """How one range of SGLang releases sizes the request table and the running-request limit, with its source.

    ``extra_row``: the table holds ``max_num_reqs + 1`` rows; ``draft_width``: each row is
    ``speculative_num_draft_tokens`` wider with speculative decoding; ``resolve``: ``tp_worker`` (the formula or
    the given limit sizes the table, the scheduler runs ``min(tokens // 2 or given // dp, rows)``),
    ``estimated_cap`` (0.5.10: a given limit capped by the estimate, else the estimate capped by half the
    capacity; the table and the scheduler alike) or ``capacity_cap`` (0.5.14: a given limit capped by half the
    capacity)."""

    release: str
    extra_row: bool
    draft_width: bool
    resolve: Resolve
    sources: tuple[str, ...]
    at_least_one: bool = False  # a given limit leaves every DP rank at least one request


REQ_RULES: tuple[ReqRule, ...] = (
    ReqRule(release="0.4.0", extra_row=True, draft_width=False, resolve="tp_worker",
            sources=(("0.4.1 wheel, model_executor/model_runner.py:537-538 init_memory_pool: ReqToTokenPool(size="
                      "max_num_reqs + 1, max_context_len=self.model_config.context_len + 4); the same in the 0.4.5 "
                      "(:759) and 0.4.6 (:795) wheels; managers/tp_worker.py:92: max_running_requests = min(max_total_"
                      "num_tokens // 2 (given: max_running_requests // dp_size), req_to_token_pool.size)"),)),
    ReqRule(release="0.4.7", extra_row=False, draft_width=False, resolve="tp_worker",
            sources=(("0.4.7 wheel, model_executor/model_runner.py:933 (and 0.4.8 :949, 0.4.9, 0.4.10): "
                      "ReqToTokenPool(size=max_num_reqs, max_context_len=context_len + 4)"),)),
    ReqRule(release="0.5.1", extra_row=False, draft_width=True, resolve="tp_worker",
            sources=(("0.5.1 wheel, model_executor/model_runner.py:1249-1251: extra_max_context_len = 4, += "
                      "server_args.speculative_num_draft_tokens when set (0.4.10 has context_len + 4 only; 0.5.0 is "
                      "not on PyPI); the same in 0.5.2, 0.5.3 (:1504), 0.5.6 and 0.5.9 (model_runner_kv_cache_"
                      "mixin.py); 0.5.3 tp_worker.py:144 and 0.5.9 model_runner.py:593 keep min(tokens // 2 or "
                      "given // dp, req_to_token_pool.size)"),)),
    ReqRule(release="0.5.10", extra_row=False, draft_width=True, resolve="estimated_cap",
            sources=(("0.5.10 wheel, model_executor/model_runner_kv_cache_mixin.py:840 _resolve_max_num_reqs: "
                      "estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048); given: "
                      "min(max_running_requests // dp_size, estimated), else min(estimated, token_capacity // 2); "
                      ":887 sets MemoryPoolConfig.max_running_requests to it and _init_pools (:387, :465) sizes "
                      "ReqToTokenPool(size=max_num_reqs); tp_worker.py:295 reads model_runner.max_running_requests. "
                      "The same in 0.5.11, 0.5.12 and 0.5.13"),)),
    ReqRule(release="0.5.14", extra_row=False, draft_width=True, resolve="capacity_cap",
            sources=(("0.5.14 wheel, model_executor/model_runner_kv_cache_mixin.py:981 _resolve_max_num_reqs: "
                      "given: min(max_running_requests // dp_size, token_capacity // 2); the same in 0.5.18 and "
                      "0.5.20 (mem_cache/kv_cache_configurator.py:1882, :2272), 0.5.21 (:2301) and 0.5.22 (:2809)"),)),
    ReqRule(release="0.5.23", extra_row=False, draft_width=True, resolve="capacity_cap", at_least_one=True,
            sources=(("0.5.23 wheel, mem_cache/kv_cache_configurator.py:3128 resolve_max_num_reqs: requested_per_worker "
                      "= max(1, max_running_requests // attn_dp_size); allocation_sizing.py:96 keeps the row width 4 + "
                      "num_draft_tokens"),)),
)


def req_rule_for(release: tuple[int, int, int]) -> ReqRule:
    """The request-table rule of ``release`` (the newest row at or before it)."""
    return [r for r in REQ_RULES if _v(r.release) <= release][-1]


@dataclass(frozen=True)
class RequestPool:
    """The request table and the running limit of one (DP) rank: ``max_num_reqs`` as SGLang names it, the table's
    ``rows`` and ``width`` (int32 each), and the requests the scheduler runs at once."""

    max_num_reqs: int
    rows: int
    width: int
    running: int

    @property
    def table_bytes(self) -> int:
        return self.rows * self.width * 4


def estimated_reqs(tokens: int, context_len: int) -> int:
    """SGLang's table size from the pool: ``min(max(int(tokens / context_len x 512), 2048), 4096)``.
    444,058 tokens at a context of 131,072: int(1734.6) = 1734 -> 2048."""
    return min(max(int(tokens / context_len * 512), 2048), 4096)


def request_pool(rule: ReqRule, profiled: int, capacity: int, pool_tokens: int, context_len: int,
                 given: int | None, dp: int, draft_tokens: int | None) -> RequestPool:
    """The request table and running limit by ``rule``.

    ``profiled``: the tokens ``profile_max_num_token`` returned (before the page rounding), which the formula reads
    before 0.5.10; ``capacity``: the page-aligned tokens 0.5.10 on reads; ``pool_tokens``: the pool's final size
    (with 0.4.5-0.5.6's speculative headroom), whose half caps the running requests before 0.5.10; ``given``: a
    given (or speculative decoding's defaulted) ``max_running_requests``; ``dp``: DP attention's dp_size;
    ``draft_tokens``: ``speculative_num_draft_tokens`` (None: speculative decoding off)."""
    width = context_len + 4 + ((draft_tokens or 0) if rule.draft_width else 0)
    if rule.resolve == "tp_worker":
        max_num_reqs = given or estimated_reqs(profiled, context_len)
        rows = max_num_reqs + (1 if rule.extra_row else 0)
        return RequestPool(max_num_reqs, rows, width, min(given // dp if given else pool_tokens // 2, rows))
    estimated = estimated_reqs(capacity, context_len)
    if given is None:
        n = min(estimated, capacity // 2)
    else:
        per_rank = max(1, given // dp) if rule.at_least_one else given // dp
        n = min(per_rank, estimated if rule.resolve == "estimated_cap" else capacity // 2)
    return RequestPool(n, n, width, n)


def captured_graph_bs(cuda_graph_max_bs: int, rows: int) -> int:
    """The largest decode batch captured in a CUDA graph: ``cuda_graph_max_bs`` (assumed one of SGLang's capture
    sizes, as every default is) unless the request table has fewer rows, which are then captured instead."""
    return min(cuda_graph_max_bs, rows)
