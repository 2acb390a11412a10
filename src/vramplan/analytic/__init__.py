"""The analytic engine: closed-form memory terms, one module per term, no torch.

``train.train_step`` walks the phases of a training step and ``inference.inference_step`` those
of a ``generate`` call; each returns its moments (``moment.Moment``, filled through the declared
keys ``moment.K``) and the peak.  ``vramplan.engine.estimate``, a layer above, picks the task's
model (serving's is ``vramplan.serve.report``) and turns the peak into the ``Report``.
"""

from __future__ import annotations

from typing import Any

from vramplan.analytic.moment import KEYS, PHASES, K, Key, Moment, Phase

__all__ = ["KEYS", "PHASES", "K", "Key", "Moment", "Phase"]


def __getattr__(name: str) -> Any:
    # compatibility: ``vramplan.analytic.estimate`` (this package's face until the task dispatch moved above
    # the analytic and serving layers, to ``vramplan.engine``) loads on first use, so that importing the
    # package imports nothing above it
    if name == "estimate":
        from vramplan.engine import estimate

        return estimate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
