"""`PYTORCH_CUDA_ALLOC_CONF` parsing, following c10/cuda/CUDAAllocatorConfig.cpp (`lexArgs`,
`parseArgs`, `parseMaxSplitSize`, `parseGarbageCollectionThreshold`,
`parseRoundUpPower2Divisions`, ...): same keys, same validation, same units (MB = 2**20 bytes)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from peakmem.allocator.rules import AllocatorRules

MB = 1024 * 1024
SIZE_MAX = 2**64 - 1
K_LARGE_BUFFER = 20 * MB
K_MIN_LARGE_ALLOC_MB = 10
ROUNDUP_POWER2_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: intervals 1 MiB .. 64 GiB

# Options that only affect host (pinned) memory, locking or graph capture: accepted, no effect on
# device-memory simulation.
_ACCEPTED_WITHOUT_EFFECT = {
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
}


SIMULATED_BACKENDS = ("native",)
"""`backend:` values the simulation implements; cudaMallocAsync (the driver's stream-ordered
allocator) is a valid PyTorch setting but is refused here rather than simulated as native."""


class AllocatorConfigError(ValueError):
    """An allocator configuration string PyTorch would reject."""


class BackendNotSimulated(AllocatorConfigError):
    """A valid PyTorch setting peakmem does not simulate (`backend:cudaMallocAsync`)."""


def _is_power_of_2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class AllocatorConfig:
    """The caching allocator's settings, as PyTorch holds them after parsing."""

    max_split_size: int = SIZE_MAX
    """Blocks at least this large are never split (bytes; SIZE_MAX = unset)."""
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    """A request >= max_split_size may take a cached block at most this much larger."""
    large_segment_size: int = K_LARGE_BUFFER
    """kLargeBuffer / `large_segment_size_mb`: the segment for 1-10 MiB requests and the page of
    expandable large-pool segments."""
    garbage_collection_threshold: float = 0.0
    """Fraction of the allowed memory above which cached blocks are garbage-collected."""
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_POWER2_INTERVALS
    """Per power-of-two interval (1 MiB, 2 MiB, ... 32 GiB and above): divisions, 0 = off."""
    expandable_segments: bool = False
    backend: str = "native"
    source: str = field(default="", compare=False)
    """The string this config was parsed from."""

    @property
    def max_split_size_set(self) -> bool:
        return self.max_split_size != SIZE_MAX

    @classmethod
    def parse(cls, conf: str | None, torch_version: str | None = None) -> AllocatorConfig:
        """Parse a `PYTORCH_CUDA_ALLOC_CONF`-style string as torch `torch_version` (default: the
        newest supported) would; raise AllocatorConfigError where PyTorch would raise."""
        rules = AllocatorRules.for_version(torch_version)
        if not conf:
            return cls(source=conf or "")
        tokens = _lex(conf)
        values: dict[str, object] = {}
        divisions = [0] * ROUNDUP_POWER2_INTERVALS
        # large_segment_size_mb is parsed first: it sets the minimum of the other sizes.
        large_segment = K_LARGE_BUFFER
        if rules.large_segment_size_configurable and "large_segment_size_mb" in tokens:
            at = tokens.index("large_segment_size_mb") + 2
            mb = _parse_int(tokens, at, "large_segment_size_mb")
            if mb <= K_MIN_LARGE_ALLOC_MB:
                raise AllocatorConfigError(
                    f"CachingAllocator option large_segment_size_mb must be > {K_MIN_LARGE_ALLOC_MB} MB"
                )
            large_segment = min(mb, SIZE_MAX // MB) * MB
            values["large_segment_size"] = large_segment
            values["max_non_split_rounding_size"] = large_segment
        min_mb = large_segment // MB
        i = 0
        while i < len(tokens):
            key = tokens[i]
            i = _consume(tokens, i + 1, ":", key)
            if rules.config_options is not None and key not in rules.config_options:
                raise AllocatorConfigError(f"Unrecognized CachingAllocator option: {key}")
            if key == "max_split_size_mb":
                mb = _parse_int(tokens, i, key)
                _check_split_size_minimum(key, mb, min_mb, rules)
                values["max_split_size"] = min(mb, SIZE_MAX // MB) * MB
            elif key == "large_segment_size_mb" and rules.large_segment_size_configurable:
                pass  # parsed above
            elif key == "max_non_split_rounding_mb" and rules.max_non_split_rounding_configurable:
                mb = _parse_int(tokens, i, key)
                _check_split_size_minimum(key, mb, min_mb, rules)
                values["max_non_split_rounding_size"] = min(mb, SIZE_MAX // MB) * MB
            elif key == "garbage_collection_threshold":
                try:
                    threshold = float(tokens[i])
                except (ValueError, IndexError):
                    raise AllocatorConfigError(f"expected a number for {key}") from None
                if not 0.0 < threshold < 1.0:
                    raise AllocatorConfigError(
                        "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
                    )
                values["garbage_collection_threshold"] = threshold
            elif key == "roundup_power2_divisions":
                i = _parse_roundup_divisions(tokens, i, divisions, rules)
                values["roundup_power2_divisions"] = tuple(divisions)
            elif key == "expandable_segments":
                values["expandable_segments"] = _parse_bool(tokens, i, key)
            elif key == "backend":
                backend = tokens[i] if i < len(tokens) else ""
                if backend not in ("native", "cudaMallocAsync"):
                    raise AllocatorConfigError(
                        f"Unknown allocator backend, options are native and cudaMallocAsync, got {backend!r}"
                    )
                if backend not in SIMULATED_BACKENDS:
                    raise BackendNotSimulated(
                        f"allocator backend {backend} is not simulated: peakmem simulates only the "
                        "native caching allocator (drop backend:cudaMallocAsync to estimate with it)"
                    )
                values["backend"] = backend
            elif key in _ACCEPTED_WITHOUT_EFFECT:
                if i >= len(tokens):
                    raise AllocatorConfigError(f"missing value for {key}")
            else:
                raise AllocatorConfigError(f"Unrecognized CachingAllocator option: {key}")
            i += 1
            if i < len(tokens):
                i = _consume(tokens, i, ",", key)
        return replace(cls(source=conf), **values)  # type: ignore[arg-type]

    def roundup_divisions_for(self, size: int) -> int:
        """`CUDAAllocatorConfig::roundup_power2_divisions(size)`: the divisions of the power-of-two
        interval `size` falls in. Intervals start at 1 MiB (index 0); smaller sizes use index 0,
        sizes of 32 GiB and above the last index."""
        index = size.bit_length() - 1 - 20
        index = max(0, min(index, ROUNDUP_POWER2_INTERVALS - 1))
        return self.roundup_power2_divisions[index]


def _check_split_size_minimum(key: str, mb: int, min_mb: int, rules: AllocatorRules) -> None:
    """parseMaxSplitSize / parseMaxNonSplitRoundingSize: `val_env >= min_allowed_split_size_mb`
    (AcceleratorAllocatorConfig, 2.10+) or `val1 > kLargeBuffer / mb` (CUDAAllocatorConfig.cpp,
    <= 2.9)."""
    if rules.split_size_minimum_inclusive:
        if mb < min_mb:
            raise AllocatorConfigError(
                f"CachingAllocator option {key} too small, must be >= {min_mb}"
            )
    elif mb <= min_mb:
        raise AllocatorConfigError(f"CachingAllocator option {key} too small, must be > {min_mb}")


def _lex(conf: str) -> list[str]:
    tokens: list[str] = []
    buf: list[str] = []
    for ch in conf:
        if ch in ",:[]":
            if buf:
                tokens.append("".join(buf))
                buf.clear()
            tokens.append(ch)
        elif ch != " ":
            buf.append(ch)
    if buf:
        tokens.append("".join(buf))
    return tokens


def _consume(tokens: list[str], i: int, expected: str, key: str) -> int:
    if i >= len(tokens) or tokens[i] != expected:
        got = tokens[i] if i < len(tokens) else "end of string"
        raise AllocatorConfigError(
            f"Error parsing CachingAllocator option {key}: expected {expected!r}, got {got!r}"
        )
    return i + 1


_PARSED_INT_MAX = 2**64 - 1
"""The largest integer PyTorch's option parser reads (std::stoi / std::stoull throw
std::out_of_range above their type's range: no version reads more than an unsigned 64-bit)."""


def _parse_int(tokens: list[str], i: int, key: str) -> int:
    try:
        value = int(tokens[i])
    except (ValueError, IndexError):
        raise AllocatorConfigError(f"expected an integer for {key}") from None
    if abs(value) > _PARSED_INT_MAX:
        raise AllocatorConfigError(
            f"{key}: {tokens[i][:40]} is out of range (PyTorch reads it as a C++ integer of at "
            "most 64 bits and fails: std::out_of_range)"
        )
    return value


def _parse_bool(tokens: list[str], i: int, key: str) -> bool:
    value = tokens[i] if i < len(tokens) else ""
    if value not in ("True", "False"):
        raise AllocatorConfigError(
            f"Expected a single True/False argument for {key}, got {value!r}"
        )
    return value == "True"


def _parse_roundup_divisions(
    tokens: list[str], i: int, divisions: list[int], rules: AllocatorRules
) -> int:
    """Fill `divisions` from either `N` (all intervals) or `[MB:N,MB:N,>:N]`; returns the index
    of the last token consumed."""
    key = "roundup_power2_divisions"
    if i < len(tokens) and tokens[i] == "[":
        last_index = 0
        first_value = True  # the C++ `first_value` flag: only the first key fills below itself
        i += 1
        while i < len(tokens) and tokens[i] != "]":
            interval = tokens[i]
            i = _consume(tokens, i + 1, ":", key)
            value = _parse_int(tokens, i, key)
            if not (_is_power_of_2(value) or (value == 0 and rules.list_divisions_may_be_zero)):
                raise AllocatorConfigError(
                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup"
                )
            if interval == ">":
                start = last_index + 1 if rules.roundup_gt_fills_from_next_interval else last_index
                for j in range(start, ROUNDUP_POWER2_INTERVALS):
                    divisions[j] = value
            else:
                try:
                    interval_mb = int(interval)
                except ValueError:
                    raise AllocatorConfigError(f"bad interval {interval!r} in {key}") from None
                if not _is_power_of_2(interval_mb):
                    raise AllocatorConfigError("For roundups, the intervals have to be power of 2")
                index = min(int(math.log2(interval_mb)), ROUNDUP_POWER2_INTERVALS - 1)
                if first_value:
                    for j in range(index):
                        divisions[j] = value
                    first_value = False
                divisions[index] = value
                last_index = index
            i += 1
            if i < len(tokens) and tokens[i] == ",":
                i += 1
        if i >= len(tokens):
            raise AllocatorConfigError(f"Error parsing CachingAllocator option {key}: missing ']'")
        return i
    value = _parse_int(tokens, i, key)
    if not _is_power_of_2(value):
        raise AllocatorConfigError("For roundups, the divisions has to be power of 2")
    for j in range(ROUNDUP_POWER2_INTERVALS):
        divisions[j] = value
    return i
