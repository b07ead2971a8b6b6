"""PYTORCH_CUDA_ALLOC_CONF parsing, as CUDAAllocatorConfig / AcceleratorAllocatorConfig do it."""

import pytest

from peakmem.allocator import AllocatorConfig, AllocatorConfigError, AllocatorRules

MiB = 1024 * 1024


def test_empty_string_is_the_default():
    config = AllocatorConfig.parse("")
    assert not config.max_split_size_set
    assert config.max_non_split_rounding_size == 20 * MiB
    assert not config.expandable_segments
    assert config.roundup_power2_divisions == (0,) * 16


def test_several_keys_and_spaces():
    config = AllocatorConfig.parse(
        " max_split_size_mb:128, expandable_segments:True ,garbage_collection_threshold:0.6"
    )
    assert config.max_split_size == 128 * MiB
    assert config.expandable_segments
    assert config.garbage_collection_threshold == 0.6


def test_max_split_size_minimum_is_20_mb_inclusive():
    assert AllocatorConfig.parse("max_split_size_mb:20").max_split_size == 20 * MiB
    with pytest.raises(AllocatorConfigError, match="too small, must be >= 20"):
        AllocatorConfig.parse("max_split_size_mb:19")


def test_max_split_size_minimum_is_exclusive_up_to_2_9():
    """c10/cuda/CUDAAllocatorConfig.cpp parseMaxSplitSize / parseMaxNonSplitRoundingSize (the
    CUDA parser up to 2.9): `TORCH_CHECK(val1 > kLargeBuffer / mb, "... too small, must be > ",
    kLargeBuffer / mb)` with kLargeBuffer / mb = 20971520 / 1048576 = 20: 20 is rejected, 21 is
    the smallest value. AcceleratorAllocatorConfig (2.10+) checks `val_env >= 20`."""
    for version in ("2.4", "2.6", "2.9"):
        with pytest.raises(AllocatorConfigError, match="must be > 20"):
            AllocatorConfig.parse("max_split_size_mb:20", version)
        assert AllocatorConfig.parse("max_split_size_mb:21", version).max_split_size == 21 * MiB
    with pytest.raises(AllocatorConfigError, match="must be > 20"):
        AllocatorConfig.parse("max_non_split_rounding_mb:20", "2.6")
    assert AllocatorConfig.parse("max_split_size_mb:20", "2.10").max_split_size == 20 * MiB
    assert (
        AllocatorConfig.parse("max_non_split_rounding_mb:20", "2.10").max_non_split_rounding_size
        == 20 * MiB
    )


@pytest.mark.parametrize("value", ["0", "1.0", "1.5", "-0.1"])
def test_gc_threshold_must_lie_strictly_between_0_and_1(value):
    with pytest.raises(AllocatorConfigError, match="garbage_collect_threshold"):
        AllocatorConfig.parse(f"garbage_collection_threshold:{value}")


def test_roundup_single_value_fills_every_interval():
    assert AllocatorConfig.parse("roundup_power2_divisions:8").roundup_power2_divisions == (8,) * 16
    with pytest.raises(AllocatorConfigError, match="power of 2"):
        AllocatorConfig.parse("roundup_power2_divisions:3")


def test_roundup_list_newest_parser():
    divs = AllocatorConfig.parse(
        "roundup_power2_divisions:[256:1,512:2,>:8]"
    ).roundup_power2_divisions
    # the first key also fills the intervals below it; '>' fills after the last key
    assert divs == (1,) * 9 + (2,) + (8,) * 6


def test_roundup_list_old_parser_overwrites_last_key_with_gt():
    divs = AllocatorConfig.parse(
        "roundup_power2_divisions:[256:1,512:2,>:8]", "2.4.1"
    ).roundup_power2_divisions
    assert divs == (1,) * 9 + (8,) * 7


def test_roundup_list_zero_allowed_from_2_5():
    """`val2 == 0 || llvm::isPowerOf2_64(val2)` in parseRoundUpPower2Divisions: PR #126833
    ("Allow division of 0", opened 2024-05-22) is in every stored CUDAAllocatorConfig.cpp that
    has max_non_split_rounding (2.6+) and in the AllocatorConfig.cpp parsers; its sibling
    PR #126830 (divisions == 1 -> 512 B rounding) is already taken to be in 2.5, so 0 is accepted
    from 2.5 on (2.4 is an assumption: the merge date was not found). An earlier version of this
    test required 2.5 to reject 0 (boundary taken to be 2.8); no source supports that.

    [64:4,>:0] -> 64 MB is index 6; the first key fills 0..5 with 4; '>' fills from
    last_index + 1 = 7 (2.10+) or from last_index = 6 (<= 2.9, overwriting the 64 MB entry)."""
    assert (
        AllocatorConfig.parse(
            "roundup_power2_divisions:[64:4,>:0]", "2.13"
        ).roundup_power2_divisions
        == (4,) * 7 + (0,) * 9
    )
    assert (
        AllocatorConfig.parse("roundup_power2_divisions:[64:4,>:0]", "2.5").roundup_power2_divisions
        == (4,) * 6 + (0,) * 10
    )
    with pytest.raises(AllocatorConfigError):
        AllocatorConfig.parse("roundup_power2_divisions:[64:4,>:0]", "2.4")


def test_roundup_gt_fills_after_the_last_key_from_2_10():
    """CUDA parses with AcceleratorAllocatorConfig (c10/core/AllocatorConfig.cpp, `std::fill` from
    `last_index + 1`) from the Oct 2025 stack (#165131, #165135, #165281, #165304), after the
    2.9 branch cut; 2.9 still used CUDAAllocatorConfig.cpp's parser (fill from `last_index`).

    [256:1,512:2,>:8]: 256 -> index 8, 512 -> index 9; 2.9: indices 9.. = 8; 2.10: 10.. = 8."""
    conf = "roundup_power2_divisions:[256:1,512:2,>:8]"
    assert AllocatorConfig.parse(conf, "2.9.1").roundup_power2_divisions == (1,) * 9 + (8,) * 7
    assert AllocatorConfig.parse(conf, "2.10.0").roundup_power2_divisions == (
        (1,) * 9 + (2,) + (8,) * 6
    )


def test_roundup_interval_keys_must_be_powers_of_two():
    with pytest.raises(AllocatorConfigError, match="intervals have to be power of 2"):
        AllocatorConfig.parse("roundup_power2_divisions:[300:4]")


def test_divisions_lookup_by_size():
    config = AllocatorConfig.parse("roundup_power2_divisions:[2:2,4:4,>:8]")
    assert config.roundup_divisions_for(100) == 2  # below 1 MiB: the first interval
    assert config.roundup_divisions_for(MiB) == 2
    assert config.roundup_divisions_for(3 * MiB) == 2
    assert config.roundup_divisions_for(5 * MiB) == 4
    assert config.roundup_divisions_for(64 * 1024 * MiB) == 8  # clamped to the last interval


def test_roundup_list_only_the_first_key_fills_the_intervals_below_it():
    """parseRoundUpPower2Divisions (CUDAAllocatorConfig.cpp in every stored version up to the
    CUDA parser's move, c10/core/AllocatorConfig.cpp AcceleratorAllocatorConfig after it) spots
    the first key with a `first_value` flag, not with `last_index == 0`. So a first key of 1 MB
    (index 63 - clz(1) = 0) fills nothing below it, and later keys never fill backwards:

    [1:2,8:4]: 1 -> index 0 = 2; 8 -> index 3 = 4; indices 1, 2 (2 MiB, 4 MiB) keep 0.
    [1:2,2:4,>:8]: [0] = 2, [1] = 4, '>' fills from last_index + 1 = 2 (new parser) or from
    last_index = 1 (old parser, overwriting the 2 MB entry).

    (An earlier version of this test expected a `last_index == 0` quirk that no stored source
    has: it gave (4, 4, ...) for the second string.)"""
    for version in ("2.4", "2.13"):
        divs = AllocatorConfig.parse("roundup_power2_divisions:[1:2,8:4]", version)
        assert divs.roundup_power2_divisions == (2, 0, 0, 4) + (0,) * 12
    new = AllocatorConfig.parse("roundup_power2_divisions:[1:2,2:4,>:8]", "2.13")
    assert new.roundup_power2_divisions == (2, 4) + (8,) * 14
    old = AllocatorConfig.parse("roundup_power2_divisions:[1:2,2:4,>:8]", "2.4")
    assert old.roundup_power2_divisions == (2,) + (8,) * 15


def test_max_non_split_rounding_exists_from_2_6():
    assert (
        AllocatorConfig.parse("max_non_split_rounding_mb:64", "2.6").max_non_split_rounding_size
        == 64 * MiB
    )
    with pytest.raises(AllocatorConfigError, match="Unrecognized"):
        AllocatorConfig.parse("max_non_split_rounding_mb:64", "2.5")
    with pytest.raises(AllocatorConfigError, match="must be >= 20"):
        AllocatorConfig.parse("max_non_split_rounding_mb:8")


def test_large_segment_size_sets_segment_and_minimums_from_2_12():
    config = AllocatorConfig.parse("large_segment_size_mb:64,max_split_size_mb:64")
    assert config.large_segment_size == 64 * MiB
    assert config.max_non_split_rounding_size == 64 * MiB
    with pytest.raises(AllocatorConfigError, match="must be >= 64"):
        AllocatorConfig.parse("large_segment_size_mb:64,max_split_size_mb:32")
    with pytest.raises(AllocatorConfigError, match="must be > 10"):
        AllocatorConfig.parse("large_segment_size_mb:10")
    with pytest.raises(AllocatorConfigError, match="Unrecognized"):
        AllocatorConfig.parse("large_segment_size_mb:64", "2.11")


@pytest.mark.parametrize(
    "bad",
    [
        "nonsense:1",
        "expandable_segments:yes",
        "max_split_size_mb",
        "max_split_size_mb:abc",
        "backend:magic",
        "expandable_segments:True;max_split_size_mb:30",
    ],
)
def test_bad_strings_are_rejected(bad):
    with pytest.raises(AllocatorConfigError):
        AllocatorConfig.parse(bad)


def test_host_only_options_are_accepted():
    config = AllocatorConfig.parse(
        "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
    )
    assert config == AllocatorConfig()


def test_version_rules_pick_the_newest_entry_not_after_the_version():
    assert not AllocatorRules.for_version("2.5.1").max_non_split_rounding_configurable
    assert AllocatorRules.for_version("2.6.0+cu124").max_non_split_rounding_configurable
    assert AllocatorRules.for_version("2.13.0").large_segment_size_configurable
    with pytest.raises(ValueError, match="no allocator rules for torch 2.3.1; known: 2.4, "):
        AllocatorRules.for_version("2.3.1")
    with pytest.raises(ValueError, match="not a torch version"):
        AllocatorRules.for_version("latest")


def test_torch_1_10_parses_only_max_split_size_mb():
    """torch 1.10's parseArgs knew one option, max_split_size_mb (> 20), and rejected others."""
    from peakmem.profiles import load_stack

    assert AllocatorConfig.parse("max_split_size_mb:128", "1.10.2").max_split_size == 128 * 2**20
    for conf in ("expandable_segments:True", "garbage_collection_threshold:0.6",
                 "roundup_power2_divisions:4", "backend:native"):
        with pytest.raises(AllocatorConfigError, match="Unrecognized CachingAllocator option"):
            AllocatorConfig.parse(conf, "1.10")
        AllocatorConfig.parse(conf, "2.4")  # the same option is known from 2.4 on
    with pytest.raises(AllocatorConfigError, match="must be > 20"):
        AllocatorConfig.parse("max_split_size_mb:20", "1.10")
    with pytest.raises(ValueError, match="legacy: 1.10"):
        AllocatorRules.for_version("1.9")
    assert load_stack("1.10.1").name == "torch-1.10"
    assert load_stack("1.10.1").module_loading({}) == "eager"  # CUDA 10.2 wheels


@pytest.mark.parametrize("key", ["max_split_size_mb", "max_non_split_rounding_mb"])
def test_a_size_past_64_bits_is_rejected_as_torchs_parser_rejects_it(key):
    with pytest.raises(AllocatorConfigError, match="out of range"):
        AllocatorConfig.parse(f"{key}:{2**64}")
    # the largest value the parser reads is clamped, not refused
    config = AllocatorConfig.parse(f"{key}:{2**64 - 1}")
    assert config.max_split_size > 0
