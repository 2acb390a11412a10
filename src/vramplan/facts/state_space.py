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

__all__ = ["MAMBA2_SCAN_EINSUM_RELEASE", "UNBUILT_STATE_SPACE", "UnbuiltFamily", "mamba2_scan_broadcasts"]


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


# The first transformers release whose torch Mamba2 scan (``mamba2_chunk_scan``, shared by bamba, falcon_h1,
# granitemoehybrid, mamba2, nemotron_h and zamba2) contracts with ``torch.einsum``.  Before it (read in the 5.17.0
# wheel, ``models/bamba/modeling_bamba.py``) the scan multiplies broadcast views and sums the product:
# ``G = (C[:, :, :, None, :, :] * B[:, :, None, :, :, :]).sum(dim=-1)``, ``Y_diag = (M[..., None] *
# hidden_states[:, :, None]).sum(dim=3)``, ``states = (B_decay[..., None, :] * hidden_states[..., None]).sum(dim=2)``,
# ``new_states = (decay_chunk[..., None, None] * states[:, :, None, ...]).sum(dim=1)`` and ``C_times_states = C[...,
# None, :] * states[:, :, None, ...]``, each product a full fp32 tensor of the broadcast shape (5.18.0's wheel has the
# einsums; 5.17.0, 5.18.0, 5.19.0, 5.20.0, 5.22.0, 5.23.0 and 5.24.0 read).  Measured on an H100 (torch 2.11,
# transformers 5.17.0, benchmarks/gpu/h100-2026-11-27): a synthetic Bamba at 8 x 2,048 prompt tokens asked for the
# G product's 8 x 8 x 256 x 256 x 64 x 128 x 4 B = 128 GiB.
MAMBA2_SCAN_EINSUM_RELEASE: tuple[int, int, int] = (5, 18, 0)


def mamba2_scan_broadcasts(transformers_version: tuple[int, ...] | None) -> bool:
    """Whether the torch Mamba2 scan of that transformers release materializes its broadcast products (before
    5.18.0); False when the release is unset (the current release's einsum scan is modelled).

    >>> mamba2_scan_broadcasts((5, 17, 0)), mamba2_scan_broadcasts((5, 18, 0)), mamba2_scan_broadcasts(None)
    (True, False, False)
    """
    return transformers_version is not None and tuple(transformers_version) < MAMBA2_SCAN_EINSUM_RELEASE
