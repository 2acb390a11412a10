"""The analytic engine: closed-form memory terms, one module per term, no torch.

``train.train_step`` walks the phases of a training step and ``inference.inference_step`` those
of a ``generate`` call; each returns its moments (``moment.Moment``, filled through the declared
keys ``moment.K``) and the peak.  ``vramplan.engine.estimate``, a layer above, picks the task's
model (serving's is ``vramplan.serve.report``) and turns the peak into the ``Report``.
"""

from __future__ import annotations

from vramplan.analytic.moment import KEYS, PHASES, K, Key, Moment, Phase

__all__ = ["KEYS", "PHASES", "K", "Key", "Moment", "Phase"]
