"""accelerate behaviour that moves memory, by release, as data.

``FSDP_UPCAST_RELEASE``: from accelerate v0.30.0 ``Accelerator.prepare_model`` upcasts each FSDP unit's trainable
flat parameter that is not fp32 to fp32 when mixed precision is set (PR huggingface/accelerate#2674, commit 9557598,
2024-04-29, "Add Upcasting for FSDP in Mixed Precision"; first tag containing it: v0.30.0), "to follow DeepSpeed's
strategy to hold the parameters in full precision"; FSDP2's ``fsdp2_prepare_model`` (``utils/fsdp_utils.py``) upcasts
too, differently by release (below).  Read at accelerate 16cb6eb (2026-11, ``src/accelerate/accelerator.py`` "Upcasted low precision parameters
in ... because mixed precision turned on in FSDP") and v0.30.0 (``accelerator.py`` lines 1485-1537).

Not the same in every release: FSDP2's ``fsdp2_prepare_model`` casts the whole model (frozen parameters included)
with ``model.to(torch.float32)`` in accelerate 1.6.0-1.12.0, casts nothing in 1.13.0 (commit 758f3b1 made the cast
rebind the loop variable), and from 1.14.0 casts the trainable parameters only, none when the model holds
bitsandbytes 4-bit parameters (commit 92cc533).  Before transformers 4.30 the Trainer wrapped FSDP itself
(``Trainer._wrap_model``), not through accelerate (PR huggingface/transformers#23158, released in 4.30.0), so no
upcast ran.
"""

from __future__ import annotations

__all__ = ["FSDP2_NO_UPCAST", "FSDP2_WHOLE_MODEL", "FSDP_UPCAST_RELEASE", "FSDP_UPCAST_SOURCE",
           "TRAINER_ACCELERATE_FSDP_SINCE"]

FSDP_UPCAST_RELEASE: tuple[int, ...] = (0, 30, 0)
# accelerate releases whose FSDP2 preparation upcasts the whole model (frozen parameters too), and none
FSDP2_WHOLE_MODEL: tuple[tuple[int, ...], tuple[int, ...]] = ((1, 6, 0), (1, 13, 0))
FSDP2_NO_UPCAST: tuple[tuple[int, ...], tuple[int, ...]] = ((1, 13, 0), (1, 14, 0))
# the transformers release from which the Trainer prepares FSDP through accelerate
TRAINER_ACCELERATE_FSDP_SINCE: tuple[int, ...] = (4, 30)
FSDP_UPCAST_SOURCE = ("accelerate >= 0.30.0 Accelerator.prepare_model (PR huggingface/accelerate#2674; FSDP2: "
                      "fsdp2_prepare_model)")
