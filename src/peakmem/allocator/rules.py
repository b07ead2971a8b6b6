"""Allocator behaviour that changed between PyTorch versions, as data.

Each entry of `_VERSION_RULES` holds the rules in force from that version on; a version takes the
newest entry not after it. Sources and confidence for each boundary: docs/allocator.md.

Which versions peakmem knows: the minor releases in `KNOWN_VERSIONS` (2.4 to 2.13, the range the
rules were checked over). A patch release or local build of a known minor (2.6.3, 2.13.0+cpu,
2.7.0a0) takes that minor's rules. Anything else, older or newer (2.3, 2.14, 9.9.9), is refused by
name with the known versions listed (UnknownTorchVersion): a newer release may have changed the
allocator, and a scheduler must not get a number computed with rules that may not hold. Every
command applies the same policy (estimate, simulate, replay, bench).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

OLDEST_SUPPORTED = (2, 4)
NEWEST_KNOWN = (2, 13)
LEGACY_VERSIONS: tuple[tuple[int, int], ...] = ((1, 10),)
"""Older releases kept for published measurements made with them (the Hugging Face
efficient-training tables ran torch 1.10): their allocator takes the oldest 2.x rules at the
default configuration and accepts only the options it parsed (`config_options`)."""
KNOWN_VERSIONS: tuple[tuple[int, int], ...] = LEGACY_VERSIONS + tuple(
    (2, minor) for minor in range(OLDEST_SUPPORTED[1], NEWEST_KNOWN[1] + 1)
)
"""The minor releases whose allocator rules peakmem has (checked against PyTorch's source)."""
_VERSION_RE = re.compile(r"^\s*(\d{1,4})\.(\d{1,4})(?:\.\d{1,6})?(?:[a-z]+\d*|\.post\d+|\.dev\d+)*(?:\+[\w.]+)?\s*$")


class UnknownTorchVersion(ValueError):
    """A torch version string peakmem has no allocator rules for (one line, lists the known)."""


def known_versions_text() -> str:
    """The known versions, the 2.x range first and the legacy ones after it ("2.4, ..., 2.13;
    legacy: 1.10")."""
    current = ", ".join(f"{major}.{minor}" for major, minor in KNOWN_VERSIONS
                        if (major, minor) not in LEGACY_VERSIONS)
    legacy = ", ".join(f"{major}.{minor}" for major, minor in LEGACY_VERSIONS)
    return f"{current}; legacy: {legacy}" if legacy else current


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
    private_pools_use_expandable_segments: bool = True
    """With `expandable_segments:True` a private pool (CUDA graph, MemPool) maps its own
    expandable segment (PR #128068, June 2024, taken to be in 2.5; medium confidence). Before,
    `alloc_block` skipped expandable segments for a pool with `owner_PrivatePool` ("our
    checkpointing logic for private pools doesn't support the expandable_segments_ structure
    yet") and cudaMalloc'd plain segments for it."""
    conf_variables: tuple[str, ...] = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    """The environment variables torch reads its allocator configuration from, the first one set
    wins (the value of an empty one included). `PYTORCH_ALLOC_CONF`, the device-generic name, came
    with AcceleratorAllocatorConfig (c10/core/AllocatorConfig.cpp; taken to be 2.10, the rules'
    boundary for that parser; medium confidence, it may be 2.9); CUDAAllocatorConfig::instance()
    (2.13) reads `PYTORCH_CUDA_ALLOC_CONF` first and `PYTORCH_ALLOC_CONF` only when it is unset.
    Before, `getenv("PYTORCH_CUDA_ALLOC_CONF")` alone."""
    config_options: frozenset[str] | None = None
    """The `PYTORCH_CUDA_ALLOC_CONF` options the version's parser knows (None: all peakmem
    parses); any other is rejected as PyTorch did ("Unrecognized CachingAllocator option")."""

    @classmethod
    def for_version(cls, version: str | None) -> AllocatorRules:
        """Rules for a torch version string such as "2.4.1" or "2.13.0+cpu"; None: the newest.
        Raises UnknownTorchVersion for a version outside KNOWN_VERSIONS."""
        if version is None:
            return _VERSION_RULES[-1]
        key = parse_version(version)
        chosen = _VERSION_RULES[0]
        for rules in _VERSION_RULES:
            if rules.version <= key:
                chosen = rules
        return chosen


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a known torch version such as "2.6.3", "2.13.0+cpu" or "2.7"; raises
    UnknownTorchVersion, naming the known versions, for anything else."""
    text = version if isinstance(version, str) else repr(version)
    shown = text if len(text) <= 40 else text[:37] + "..."
    shown = "".join(ch if ch.isprintable() else "?" for ch in shown)
    match = _VERSION_RE.match(text) if len(text) <= 64 else None
    if not match:
        raise UnknownTorchVersion(
            f"not a torch version: {shown!r} (expected e.g. 2.4.1; known: {known_versions_text()})"
        )
    key = int(match.group(1)), int(match.group(2))
    if key not in KNOWN_VERSIONS:
        raise UnknownTorchVersion(
            f"no allocator rules for torch {shown}; known: {known_versions_text()}"
        )
    return key


_RULES_2_4 = AllocatorRules(
    version=(2, 4),
    max_non_split_rounding_configurable=False,
    large_segment_size_configurable=False,
    divisions_one_leaves_size_unrounded=True,
    roundup_gt_fills_from_next_interval=False,
    list_divisions_may_be_zero=False,
    split_size_minimum_inclusive=False,
    private_pools_use_expandable_segments=False,
    conf_variables=("PYTORCH_CUDA_ALLOC_CONF",),
)

_VERSION_RULES: list[AllocatorRules] = [
    # torch 1.10 c10/cuda/CUDACachingAllocator.cpp: the same block sizes and rounding as 2.4 at
    # the default configuration (kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB,
    # kLargeBuffer 20 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB); its parseArgs knew only
    # max_split_size_mb ("must be > 20") and rejected any other option.
    replace(_RULES_2_4, version=(1, 10), config_options=frozenset({"max_split_size_mb"})),
    _RULES_2_4,
    AllocatorRules(
        version=(2, 5),
        max_non_split_rounding_configurable=False,
        large_segment_size_configurable=False,
        roundup_gt_fills_from_next_interval=False,
        split_size_minimum_inclusive=False,
        conf_variables=("PYTORCH_CUDA_ALLOC_CONF",),
    ),
    AllocatorRules(
        version=(2, 6),
        large_segment_size_configurable=False,
        roundup_gt_fills_from_next_interval=False,
        split_size_minimum_inclusive=False,
        conf_variables=("PYTORCH_CUDA_ALLOC_CONF",),
    ),
    AllocatorRules(version=(2, 10), large_segment_size_configurable=False),
    AllocatorRules(version=(2, 12)),
]
