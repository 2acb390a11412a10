"""Search over a monotone predicate: the one bisection the solvers share."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["largest_true"]


def largest_true(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """Largest ``x`` in ``[lo, hi]`` with ``ok(x)``, for ``ok`` true up to a point and false after it.

    None when ``ok(lo)`` is false or the range is empty.  Calls ``ok`` about log2(hi - lo) + 1 times.

    >>> largest_true(1, 100, lambda x: x * x <= 50)
    7
    >>> largest_true(5, 10, lambda x: False) is None
    True
    """
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
