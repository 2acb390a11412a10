"""The caching allocator's sizing rules, checked against hand arithmetic (CUDACachingAllocator.cpp)."""

from __future__ import annotations

import pytest

from vramplan.alloc import parse_alloc_conf
from vramplan.alloc.caching import CachingAllocator
from vramplan.alloc.rules import (
    ADDRESS_BASE,
    DEFAULT_ADDRESS_SPACE,
    EXPANDABLE_LARGE_PAGE,
    EXPANDABLE_SMALL_PAGE,
    K_LARGE_BUFFER,
    K_MIN_BLOCK_SIZE,
    K_MIN_LARGE_ALLOC,
    K_ROUND_LARGE,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    MAX_NON_SPLIT_ROUNDING,
    SEGMENT_ALIGN,
    allocation_size,
    expandable_address_space,
    is_small,
    round_size,
    roundup_power2_next_division,
    should_split,
)

KiB, MiB = 2**10, 2**20


def test_constants_match_pytorch() -> None:
    # kMinBlockSize 512, kSmallSize 1048576, kSmallBuffer 2097152, kLargeBuffer 20971520,
    # kMinLargeAlloc 10485760, kRoundLarge 2097152
    assert (K_MIN_BLOCK_SIZE, K_SMALL_SIZE, K_SMALL_BUFFER) == (512, 1_048_576, 2_097_152)
    assert (K_LARGE_BUFFER, K_MIN_LARGE_ALLOC, K_ROUND_LARGE) == (20_971_520, 10_485_760, 2_097_152)
    # ExpandableSegment pages: kSmallBuffer and kLargeBuffer; max_non_split_rounding_size: kLargeBuffer
    assert (EXPANDABLE_SMALL_PAGE, EXPANDABLE_LARGE_PAGE, MAX_NON_SPLIT_ROUNDING) == (2 * MiB, 20 * MiB, 20 * MiB)


def test_expandable_address_space() -> None:
    # 24 GiB device: 24 + 24 / 8 = 27 GiB = 27,648 MiB; 27,648 / 20 = 1382.4, rounded up to 1383 pages
    assert expandable_address_space(24 * 2**30) == 1383 * 20 * MiB
    # a tiny or zero capacity still reserves one 20 MiB page; no capacity: the model's 2^47 B range
    assert expandable_address_space(0) == expandable_address_space(MiB) == 20 * MiB
    assert expandable_address_space(None) == DEFAULT_ADDRESS_SPACE == 2**47


def test_modelled_addresses() -> None:
    # segments start at ADDRESS_BASE = 2^40; the next one at the previous end rounded up to SEGMENT_ALIGN
    # = 2 MiB: a 12 MiB + 1 B request makes a 14 MiB segment (12 MiB + 512 B rounded up to 2 MiB), so a
    # second segment starts 14 MiB further; a 2 MiB small segment after it 14 + 14 = 28 MiB from the base
    assert (ADDRESS_BASE, SEGMENT_ALIGN) == (2**40, 2 * MiB)
    a = CachingAllocator()
    a.malloc(12 * MiB + 1)
    a.malloc(12 * MiB + 1)
    a.malloc(1000)
    assert [s.address - 2**40 for s in a.segment_views()] == [0, 14 * MiB, 28 * MiB]


@pytest.mark.parametrize(("request_bytes", "rounded"), [
    (1, 512),                 # below 512 -> 512
    (511, 512),
    (512, 512),
    (513, 1024),              # next multiple of 512
    (600 * KiB, 614_400),     # 600 KiB = 614,400 = 1200 x 512 already
    (1_000_000, 1_000_448),   # ceil(1,000,000 / 512) = 1954 -> 1954 x 512
    (12 * MiB + 1, 12 * MiB + 512),
])
def test_round_size(request_bytes: int, rounded: int) -> None:
    assert round_size(request_bytes) == rounded


def test_roundup_power2_divisions() -> None:
    # 1200 lies in [1024, 2048); 4 divisions: 1024, 1280, 1536, 1792 -> 1280 (PyTorch's own example)
    assert roundup_power2_next_division(1200, 4) == 1280
    # with the option, 5 MiB + 1 in [4, 8) MiB, 4 divisions of 1 MiB -> 6 MiB
    assert round_size(5 * MiB + 1, roundup_power2_divisions=4) == 6 * MiB
    # sizes at or below 512 x divisions keep the 512-byte rule: 2000 <= 2048 -> 2048 (4 x 512)
    assert round_size(2000, roundup_power2_divisions=4) == 2048
    assert round_size(4096, roundup_power2_divisions=4) == 4096


@pytest.mark.parametrize(("rounded", "segment"), [
    (512, 2 * MiB),                 # small pool: 2 MiB segment
    (1 * MiB, 2 * MiB),             # exactly 1 MiB is still small
    (1 * MiB + 512, 20 * MiB),      # just above 1 MiB: a shared 20 MiB segment
    (5 * MiB, 20 * MiB),
    (10 * MiB - 512, 20 * MiB),
    (10 * MiB, 10 * MiB),           # >= 10 MiB: rounded up to 2 MiB
    (12 * MiB, 12 * MiB),
    (12 * MiB + 512, 14 * MiB),
])
def test_allocation_size(rounded: int, segment: int) -> None:
    assert allocation_size(rounded) == segment


def test_pools() -> None:
    assert is_small(1 * MiB) and not is_small(1 * MiB + 512)


def test_should_split() -> None:
    # small pool: split when at least 512 B remain
    assert should_split(2 * MiB, 2 * MiB - 512, small_pool=True, expandable=False)
    assert not should_split(2 * MiB, 2 * MiB, small_pool=True, expandable=False)
    # large pool: split only when MORE than 1 MiB remains
    assert not should_split(20 * MiB, 19 * MiB, small_pool=False, expandable=False)      # 1 MiB left
    assert should_split(20 * MiB, 19 * MiB - 512, small_pool=False, expandable=False)    # 1 MiB + 512
    # expandable segments split like the small pool
    assert should_split(20 * MiB, 19 * MiB, small_pool=False, expandable=True)
    # max_split_size: a request at or above it is never split
    assert not should_split(200 * MiB, 100 * MiB, False, False, max_split_size=64 * MiB)
    assert should_split(200 * MiB, 32 * MiB, False, False, max_split_size=64 * MiB)


def test_parse_alloc_conf() -> None:
    s = parse_alloc_conf("expandable_segments:True, max_split_size_mb:128,roundup_power2_divisions:4")
    assert s.expandable_segments and s.max_split_size_bytes == 128 * MiB and s.roundup_power2_divisions == 4
    assert parse_alloc_conf("") == parse_alloc_conf("backend:native")
    with pytest.raises(ValueError, match="expandable_segments"):
        parse_alloc_conf("expandable_segments:yes")
    with pytest.raises(ValueError, match="no ':value'"):
        parse_alloc_conf("expandable_segments")
    with pytest.raises(ValueError, match="max_split_size_mb"):
        parse_alloc_conf("max_split_size_mb:lots")


def test_doctests() -> None:
    import doctest

    import vramplan.alloc
    import vramplan.alloc.rules

    for mod in (vramplan.alloc, vramplan.alloc.rules):
        assert doctest.testmod(mod).failed == 0
