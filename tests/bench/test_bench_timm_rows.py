"""benchmarks/bench_timm_rows.py: the MODEL:BATCH picks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from bench_timm_rows import parse_pick  # noqa: E402


def test_a_pick_is_a_model_and_a_batch_size():
    assert parse_pick("convnext_tiny:32") == ("convnext_tiny", 32)
    assert parse_pick("vit_base_patch16_224.augreg:8") == ("vit_base_patch16_224.augreg", 8)


@pytest.mark.parametrize("text", ["convnext_tiny", "convnext_tiny:", ":32", "convnext_tiny:x"])
def test_a_pick_without_a_model_or_a_batch_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_pick(text)
