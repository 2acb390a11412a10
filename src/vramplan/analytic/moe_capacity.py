"""Routed rows a rank's experts hold under an expert capacity factor (``parallel.moe_expert_capacity_factor``,
``parallel.moe_pad_to_capacity``).

Megatron-LM core_v0.19.0 ``megatron/core/transformer/moe/moe_utils.py``: ``apply_router_token_dropping``
(lines 958-1019) sizes each expert's capacity as ``get_capacity(num_tokens=num_tokens * router_topk,
num_experts, capacity_factor)`` = ``math.ceil((num_tokens / num_experts) * capacity_factor)`` (lines 241-259)
over the router's ``[num_tokens, num_experts]`` map of the rank's T tokens; where the capacity exceeds
``num_tokens`` the mask keeps every token.  With ``pad_to_capacity`` (``moe_pad_expert_input_to_capacity``,
transformer_config.py lines 892-895) the final map *is* the capacity mask: every expert takes exactly
``min(C, T)`` rows from every rank.  Without it the routed rows are masked by the capacity (dropped beyond it).

So, with E experts, top-k routing, T tokens per rank and ep expert-parallel ranks (E / ep experts each):

* padded: a rank's experts receive ``min(C, T)`` rows per expert from each of the ep ranks:
  ``ep x (E / ep) x min(C, T) = E x min(C, T)`` rows, exactly;
* dropping, not padded: at most that, and at most what the ep ranks route to this rank's experts,
  ``ep x T x min(k, E / ep)``; the bound is the smaller of the two (with ep 1: T x k, the balanced count);
* no factor (dropless): T x k, the balanced routing of the other terms (an assumption the report states).

Example, Mixtral (E 8, k 2), T 4,096 tokens, f 1.25, padded: C = ceil(4,096 x 2 / 8 x 1.25) = 1,280; rows =
8 x 1,280 = 10,240, against 8,192 balanced: 2,048 more rows.  Not padded with ep 8: min(10,240, 8 x 4,096 x
min(2, 1)) = 10,240.

The factor is read as an exact fraction of its decimal (Megatron computes in floating point; they differ only
where T x k x f / E lands on an integer within rounding).
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["expert_capacity", "routed_rows"]


def expert_capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Megatron-LM ``get_capacity(num_tokens * router_topk, num_experts, capacity_factor)``.

    >>> expert_capacity(4096, 2, 8, 1.25)
    1280
    """
    return math.ceil(Fraction(tokens * top_k, experts) * Fraction(str(factor)))


def routed_rows(tokens: int, top_k: int, experts: int, ep: int, factor: float | None, pad: bool) -> int:
    """The routed rows a rank's experts hold for one micro-batch of ``tokens`` tokens (module docstring).

    >>> routed_rows(4096, 2, 8, 1, None, False), routed_rows(4096, 2, 8, 1, 1.25, True)
    (8192, 10240)
    >>> routed_rows(4096, 2, 8, 1, 1.25, False), routed_rows(4096, 2, 8, 8, 1.25, False)
    (8192, 10240)
    """
    if factor is None:
        return tokens * top_k
    padded = experts * min(expert_capacity(tokens, top_k, experts, factor), tokens)
    if pad:
        return padded
    return min(padded, ep * tokens * min(top_k, experts // ep))
