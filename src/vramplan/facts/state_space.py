"""Pure state-space families transformers ships that vramplan does not build, as data: each row names the
mixer code it would have to model, so a config of that ``model_type`` is refused with that reason and the
nearest family that is estimated (a hybrid with Mamba2 mixers) instead of a close spelling of another name.

Sources: transformers 5.24 ``models/mamba/modeling_mamba.py`` (``mamba_selective_scan``'s recurrent iteration,
a Python loop over the sequence whose every step keeps a ``intermediate x state`` state for the backward),
``models/mamba2/modeling_mamba2.py`` (``Mamba2Mixer`` with its own ``mamba2_chunk_scan``), ``models/falcon_mamba/
modeling_falcon_mamba.py`` (``FalconMambaMixer``: Mamba's scan with RMS-normalized B, C and dt).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["UNBUILT_STATE_SPACE", "UnbuiltFamily"]


class UnbuiltFamily(NamedTuple):
    model_type: str
    mixer: str  # the transformers code whose tensors are not modelled
    source: str


UNBUILT_STATE_SPACE: dict[str, UnbuiltFamily] = {r.model_type: r for r in (
    UnbuiltFamily("mamba", "MambaMixer (mamba_selective_scan's recurrent loop, one state per token kept for the "
                  "backward)", "transformers 5.24 models/mamba/modeling_mamba.py mamba_selective_scan"),
    UnbuiltFamily("mamba2", "Mamba2Mixer (a Mamba2 mixer in every layer, no attention, no MLP)",
                  "transformers 5.24 models/mamba2/modeling_mamba2.py Mamba2Mixer, mamba2_chunk_scan"),
    UnbuiltFamily("falcon_mamba", "FalconMambaMixer (Mamba's selective scan with RMS-normalized B, C and dt)",
                  "transformers 5.24 models/falcon_mamba/modeling_falcon_mamba.py FalconMambaMixer, "
                  "mamba_selective_scan"),
)}
