"""Allocator behaviour that changed between PyTorch versions, as data.

Each entry of `_VERSION_RULES` holds the rules in force from that version on; a version takes the
newest entry not after it. Sources and confidence for each boundary: docs/allocator.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OLDEST_SUPPORTED = (2, 4)


@dataclass(frozen=True)
class AllocatorRules:
    """What differs between PyTorch versions in the caching allocator and its config parser."""

    version: tuple[int, int]
    max_non_split_rounding_configurable: bool = True
    """`max_non_split_rounding_mb` exists (PR #136174, torch 2.6). Before it a request of at
    least max_split_size may take a cached block at most kLargeBuffer (20 MiB) larger."""
    large_segment_size_configurable: bool = True
    """`large_segment_size_mb` exists (PR #172056, Jan 2026, torch 2.12)."""
    divisions_one_leaves_size_unrounded: bool = False
    """Old `round_size` (torch 2.4): `roundup_power2_divisions` of 1 returned the request
    unrounded (`divisions > 0` test and an early return in roundup_power2_next_division)."""
    roundup_gt_fills_from_next_interval: bool = True
    """In `roundup_power2_divisions:[...,>:N]` the `>` entry fills from the interval after the last
    listed one (`last_index + 1`, c10/core/AllocatorConfig.cpp AcceleratorAllocatorConfig, which
    CUDA parses with from torch 2.10); CUDAAllocatorConfig.cpp's own parser (<= 2.9) filled from
    `last_index`, overwriting the last listed interval too."""
    list_divisions_may_be_zero: bool = True
    """The list form accepts 0 (roundup off for that interval; PR #126833, May 2024); the 2.4
    parser is taken to require a power of 2 (see docs/allocator.md for how sure that is)."""

    split_size_minimum_inclusive: bool = True
    """`max_split_size_mb` / `max_non_split_rounding_mb` may equal the minimum (20 MB, or
    `large_segment_size_mb`): `val_env >= min_allowed_split_size_mb` in AcceleratorAllocatorConfig
    (2.10+). CUDAAllocatorConfig.cpp's own parser checked `val1 > kLargeBuffer / mb` ("must be
    > 20"), so 20 was rejected up to 2.9."""

    @classmethod
    def for_version(cls, version: str | None) -> AllocatorRules:
        """Rules for a torch version string such as "2.4.1" or "2.13.0+cpu"; None: the newest."""
        if version is None:
            return _VERSION_RULES[-1]
        key = parse_version(version)
        if key < OLDEST_SUPPORTED:
            raise ValueError(
                f"torch {version} is older than the oldest supported version "
                f"{OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]}"
            )
        chosen = _VERSION_RULES[0]
        for rules in _VERSION_RULES:
            if rules.version <= key:
                chosen = rules
        return chosen


def parse_version(version: str) -> tuple[int, int]:
    match = re.match(r"^\s*(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a torch version: {version!r} (expected e.g. 2.4.1)")
    return int(match.group(1)), int(match.group(2))


_VERSION_RULES: list[AllocatorRules] = [
    AllocatorRules(
        version=(2, 4),
        max_non_split_rounding_configurable=False,
        large_segment_size_configurable=False,
        divisions_one_leaves_size_unrounded=True,
        roundup_gt_fills_from_next_interval=False,
        list_divisions_may_be_zero=False,
        split_size_minimum_inclusive=False,
    ),
    AllocatorRules(
        version=(2, 5),
        max_non_split_rounding_configurable=False,
        large_segment_size_configurable=False,
        roundup_gt_fills_from_next_interval=False,
        split_size_minimum_inclusive=False,
    ),
    AllocatorRules(
        version=(2, 6),
        large_segment_size_configurable=False,
        roundup_gt_fills_from_next_interval=False,
        split_size_minimum_inclusive=False,
    ),
    AllocatorRules(version=(2, 10), large_segment_size_configurable=False),
    AllocatorRules(version=(2, 12)),
]
