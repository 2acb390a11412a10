"""One Hugging Face ``generate`` call, whatever the model: a decoder-only model's prefill and decode
(``analytic/inference.py``) or an encoder-decoder model's encoder, first decoder step and decode
(``analytic/encoder_decoder.py``)."""

from __future__ import annotations

from vramplan.analytic.encoder_decoder import encoder_decoder_step
from vramplan.analytic.inference import InferenceResult, inference_step
from vramplan.spec.load import Resolved

__all__ = ["generate_step"]


def generate_step(r: Resolved) -> InferenceResult:
    """The peak of one ``generate`` call over its moments (``ModelSpec.encoder_decoder`` picks the model)."""
    if r.model.encoder_decoder is not None:
        return encoder_decoder_step(r)
    return inference_step(r)
