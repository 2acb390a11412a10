"""Paged optimizer states (CUDA managed memory) hold only what the rest of the device leaves free; the
remainder is paged out to host RAM, never an out-of-memory (report ``managed_in_capacity``)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from vramplan import estimate
from vramplan.report import managed_in_capacity

PARAMS = 1_235_814_400  # Llama-3.2-1B
# bitsandbytes PagedAdamW as the engine charges it: 2 states x 2 B (bf16-true parameters) per parameter
MANAGED = PARAMS * 2 * 2  # 4,943,257,600


def _doc(optimizer: str, seq_len: int, mbs: int = 1) -> dict[str, Any]:
    return {"model": "meta-llama/Llama-3.2-1B", "hardware": {"gpu": "RTX-3060-12GB"}, "framework": "plain",
            "train": {"micro_batch_size": mbs, "seq_len": seq_len, "precision": "bf16-true", "optimizer": optimizer,
                      "gradient_checkpointing": "full"}}


def test_paged_states_that_fit_stay_on_the_device() -> None:
    rep = estimate(_doc("paged-adamw", 512))
    pg = rep.per_gpu
    assert pg.outside_allocator["managed"] == MANAGED and rep.host.managed_paged_out_bytes == 0
    assert pg.device_used_bytes == pg.peak_reserved_bytes + pg.outside_allocator["cuda_context"] + MANAGED
    # the band's high bound is the rest's, filled with managed memory up to the capacity at most
    assert pg.device_used_bytes_high == pg.capacity_bytes and rep.verdict == "FITS"
    # the same job with device-allocated AdamW states (4 B per parameter more in the allocator) does not fit
    assert estimate(_doc("adamw", 512)).verdict == "DOES NOT FIT"


def test_paged_states_beyond_the_capacity_are_paged_out() -> None:
    rep = estimate(_doc("paged-adamw", 2048, 2))
    pg = rep.per_gpu
    rest = pg.peak_reserved_bytes + pg.outside_allocator["cuda_context"]
    resident = pg.outside_allocator["managed"]
    assert resident == pg.capacity_bytes - rest > 0
    assert rep.host.managed_paged_out_bytes == MANAGED - resident > 0
    assert pg.device_used_bytes == pg.capacity_bytes and rep.fits
    assert any("paged out to host RAM" in a for a in rep.assumptions)


def test_managed_by_hand() -> None:
    # 80 reserved + 5 context leave 15 of 100: 15 resident, 50 - 15 = 35 paged out
    assert managed_in_capacity({"cuda_context": 5, "managed": 50}, 80, 100) == ({"cuda_context": 5, "managed": 15}, 35)
    # the rest alone over the capacity: nothing resident
    assert managed_in_capacity({"cuda_context": 5, "managed": 50}, 120, 100) == ({"cuda_context": 5, "managed": 0}, 50)
    assert managed_in_capacity({"cuda_context": 5}, 120, 100) == ({"cuda_context": 5}, 0)


@given(managed=st.integers(0, 10**12), reserved=st.integers(0, 10**12), ctx=st.integers(0, 10**10),
       capacity=st.integers(1, 10**12))
def test_managed_never_pushes_past_the_capacity(managed: int, reserved: int, ctx: int, capacity: int) -> None:
    out, paged_out = managed_in_capacity({"cuda_context": ctx, "managed": managed}, reserved, capacity)
    assert out["managed"] + paged_out == managed and min(out["managed"], paged_out) >= 0
    assert reserved + ctx + out["managed"] <= max(capacity, reserved + ctx)
