"""The analytic engine's reserved-bytes rules, taken from the allocator replay (vramplan.alloc)."""

from __future__ import annotations

from vramplan.analytic.allocator import allocated_bytes_for, reserved_for, segment_bytes
from vramplan.units import MiB


def test_five_8_mib_tensors_need_three_20_mib_segments() -> None:
    # 8 MiB < 10 MiB -> 20 MiB segments; two per segment (16 MiB used, 4 MiB left < 8 MiB): 3 segments = 60 MiB.
    assert reserved_for([(8 * MiB, 5)]) == 60 * MiB
    # expandable segments map only what is used, in 20 MiB pages for the large pool: 40 MiB.
    assert reserved_for([(8 * MiB, 5)], expandable_segments=True) == 40 * MiB


def test_unsplit_block_counts_whole() -> None:
    # 19.5 MiB rounds to itself (a multiple of 512), opens a 20 MiB segment (>= 10 MiB: rounded up to 2 MiB);
    # the 0.5 MiB remainder is not more than 1 MiB, so the block is not split and 20 MiB counts as allocated.
    assert segment_bytes(19 * MiB + MiB // 2) == 20 * MiB
    assert allocated_bytes_for(19 * MiB + MiB // 2) == 20 * MiB
    # 600 KiB goes to the small pool, rounded to 512 B: 614,400 B allocated out of a 2 MiB segment.
    assert allocated_bytes_for(600 * 1024) == 614_400 and segment_bytes(600 * 1024) == 2 * MiB


def test_small_tensors_share_small_segments() -> None:
    # three 600 KiB tensors: 1,843,200 B fit one 2 MiB segment.
    assert reserved_for([(600 * 1024, 3)]) == 2 * MiB
