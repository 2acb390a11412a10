"""Error metrics of a predictor against measured runs.

Definitions (each one used by every table vramplan prints):

- signed relative error ``e = (predicted - measured) / measured``: negative is an
  under-prediction (the dangerous side), positive an over-prediction.
  Example: predicted 9 GiB, measured 10 GiB -> e = -0.10.
- ``median |e|`` and ``p90 |e|``: the 50th and 90th percentiles of |e|, with linear
  interpolation between order statistics (numpy's default ``linear`` method: the value at
  rank ``q * (n - 1)`` of the sorted list).  Example: |e| = 0.1, 0.2, 0.3, 0.4, 0.5 ->
  median 0.3; p90 at rank 3.6 = 0.4 + 0.6 * (0.5 - 0.4) = 0.46.
- under / over: how many entries have e < 0 / e > 0 (an exact hit counts as neither).
- fits/OOM verdict, for every entry whose outcome is known: ``correct`` when the predictor's
  ``fits`` agrees with what happened, ``false_oom`` when it said OOM but the run fitted (an
  over-cautious answer), ``missed_oom`` when it said fits but the run ran out of memory (the
  worst failure: it is counted on its own).
- band (engines only, ``report/band.py``): the verdict ``FITS`` / ``MAY NOT FIT`` / ``DOES NOT
  FIT`` of each entry; **said FITS, OOMed** (``band_missed_oom``) counts ``FITS`` verdicts for
  runs that ran out of memory; the band's **coverage** is the share of entries with a comparable
  figure whose measured bytes lie within ``[low, high]`` of the compared quantity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["FitsVerdict", "Summary", "fits_verdict", "percentile", "relative_error", "summarize"]

FitsVerdict = Literal["correct", "false_oom", "missed_oom"]


def relative_error(predicted_bytes: int, measured_bytes: int) -> float:
    """``(predicted - measured) / measured``; measured must be positive.

    >>> relative_error(9, 10)
    -0.1
    """
    if measured_bytes <= 0:
        raise ValueError("measured_bytes must be positive")
    return (predicted_bytes - measured_bytes) / measured_bytes


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th quantile (0 <= q <= 1) with linear interpolation between order statistics.

    >>> percentile([0.5, 0.1, 0.3, 0.2, 0.4], 0.9)
    0.46
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError("q must be within [0, 1]")
    xs = sorted(values)
    rank = q * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    frac = rank - lo
    return round(xs[lo] + frac * (xs[hi] - xs[lo]), 12)


def fits_verdict(predicted_fits: bool, outcome: str) -> FitsVerdict:
    """Compare a predictor's ``fits`` with the run's outcome (``fits`` or ``oom``)."""
    ran = outcome == "fits"
    if predicted_fits == ran:
        return "correct"
    return "false_oom" if ran else "missed_oom"


class Summary(BaseModel):
    """One predictor's errors over a group of entries."""

    model_config = ConfigDict(frozen=True)

    n_error: int = 0
    median_abs_error: float | None = None
    p90_abs_error: float | None = None
    median_signed_error: float | None = None
    max_abs_error: float | None = None
    under: int = 0
    over: int = 0
    n_fits_checked: int = 0
    fits_correct: int = 0
    false_oom: int = 0
    missed_oom: int = 0
    not_run: int = 0
    band_fits: int = 0
    band_may_not_fit: int = 0
    band_does_not_fit: int = 0
    band_missed_oom: int = 0
    band_n_checked: int = 0
    band_covered: int = 0

    @property
    def band_coverage(self) -> float | None:
        """Share of the entries with a comparable figure whose measured bytes lie in the band."""
        return self.band_covered / self.band_n_checked if self.band_n_checked else None

    @property
    def fits_correct_fraction(self) -> float | None:
        return self.fits_correct / self.n_fits_checked if self.n_fits_checked else None


def summarize(errors: Sequence[float], verdicts: Sequence[FitsVerdict], not_run: int = 0,
              band_verdicts: Sequence[tuple[str, str]] = (), covered: Sequence[bool] = ()) -> Summary:
    """Summary of signed relative errors and fits/OOM verdicts (see the module docstring).

    ``band_verdicts`` holds (verdict, outcome) pairs; ``covered`` whether each comparable measured
    figure lies within the band."""
    abs_errors = [abs(e) for e in errors]
    return Summary(
        n_error=len(errors),
        median_abs_error=percentile(abs_errors, 0.5) if errors else None,
        p90_abs_error=percentile(abs_errors, 0.9) if errors else None,
        median_signed_error=percentile(list(errors), 0.5) if errors else None,
        max_abs_error=max(abs_errors) if errors else None,
        under=sum(e < 0 for e in errors),
        over=sum(e > 0 for e in errors),
        n_fits_checked=len(verdicts),
        fits_correct=sum(v == "correct" for v in verdicts),
        false_oom=sum(v == "false_oom" for v in verdicts),
        missed_oom=sum(v == "missed_oom" for v in verdicts),
        not_run=not_run,
        band_fits=sum(v == "FITS" for v, _ in band_verdicts),
        band_may_not_fit=sum(v == "MAY NOT FIT" for v, _ in band_verdicts),
        band_does_not_fit=sum(v == "DOES NOT FIT" for v, _ in band_verdicts),
        band_missed_oom=sum(v == "FITS" and o == "oom" for v, o in band_verdicts),
        band_n_checked=len(covered),
        band_covered=sum(covered),
    )
