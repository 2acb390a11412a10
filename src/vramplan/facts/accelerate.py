"""accelerate behaviour that moves memory, by release, as data.

``FSDP_UPCAST_RELEASE``: from accelerate v0.30.0 ``Accelerator.prepare_model`` upcasts each FSDP unit's trainable
flat parameter that is not fp32 to fp32 when mixed precision is set (PR huggingface/accelerate#2674, commit 9557598,
2024-04-29, "Add Upcasting for FSDP in Mixed Precision"; first tag containing it: v0.30.0), "to follow DeepSpeed's
strategy to hold the parameters in full precision"; FSDP2's ``fsdp2_prepare_model`` (``utils/fsdp_utils.py``) does the
same for every trainable parameter when ``mixed_precision != "no"`` and the model holds no bitsandbytes 4-bit
parameter.  Read at accelerate 16cb6eb (2026-11, ``src/accelerate/accelerator.py`` "Upcasted low precision parameters
in ... because mixed precision turned on in FSDP") and v0.30.0 (``accelerator.py`` lines 1485-1537).
"""

from __future__ import annotations

__all__ = ["FSDP_UPCAST_RELEASE", "FSDP_UPCAST_SOURCE"]

FSDP_UPCAST_RELEASE: tuple[int, ...] = (0, 30, 0)
FSDP_UPCAST_SOURCE = ("accelerate >= 0.30.0 Accelerator.prepare_model (PR huggingface/accelerate#2674; FSDP2: "
                      "fsdp2_prepare_model)")
