"""The analytic engine: closed-form memory terms, one module per term, no torch.

``estimate`` walks the phases of a training step, an inference pass or a serving
engine's start-up and reports the true peak with its breakdown.
"""

from vramplan.analytic.engine import estimate

__all__ = ["estimate"]
