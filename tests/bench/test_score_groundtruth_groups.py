"""benchmarks/score_groundtruth_groups.py: torchvision rows land in their own groups (issue 6's
H200 CNN set leaves out ViT, Swin, RegNet and detection), never in the Hugging Face ones."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def groups():
    sys.path.insert(0, str(BENCHMARKS))  # it imports score_groundtruth from its own folder
    try:
        spec = importlib.util.spec_from_file_location("score_groundtruth_groups",
                                                      BENCHMARKS / "score_groundtruth_groups.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module.GROUPS
    finally:
        sys.path.remove(str(BENCHMARKS))


def figures(measured: int, estimated: int) -> dict:
    return {name: {"measured": measured, "estimated": estimated}
            for name in ("peak", "reserved", "allocated")}


ROWS = {
    "h200:00001": {"job": "benchmarks/zoo/vision.py",
                   "args": "--model resnet50 --precision fp32 --batch-size 32", **figures(10, 10)},
    "h200:00002": {"job": "benchmarks/zoo/vision.py",
                   "args": "--model resnet50 --grad-checkpointing --precision bf16 --batch-size 64",
                   **figures(10, 9)},
    "h200:00003": {"job": "benchmarks/zoo/vision.py",
                   "args": "--model vit_b_16 --precision fp32 --batch-size 8", **figures(10, 10)},
    "h200:00004": {"job": "benchmarks/zoo/vision.py",
                   "args": "--model regnet_y_1_6gf --precision fp32 --batch-size 16",
                   **figures(10, 1)},
    "h200:00005": {"job": "benchmarks/zoo/detection.py",
                   "args": "--model maskrcnn_resnet50_fpn --precision fp32 --batch-size 2",
                   "error": "RuntimeError: Couldn't load custom C++ ops"},
    "h200:00006": {"job": "benchmarks/zoo/transformers_lm.py",
                   "args": "--model bert-base-uncased --precision fp32 --batch-size 4",
                   **figures(10, 10)},
    "h100-80gb:00007": {"job": "benchmarks/zoo/vision.py",
                        "args": "--model resnet50 --precision fp32 --batch-size 16",
                        **figures(10, 10)},
}


def members(groups, name: str) -> list[str]:
    return sorted(key for key, row in ROWS.items() if groups[name](key, row))


def test_vision_rows_have_their_own_groups(groups):
    assert members(groups, "H200 BERT / GPT-2 fp32") == ["h200:00006"]
    assert members(groups, "H100 (seq 128)") == []
    assert members(groups, "H200 zoo CNNs (RegNet left out)") == ["h200:00001", "h200:00002"]
    assert members(groups, "H200 zoo CNNs, plain (no knob)") == ["h200:00001"]
    assert members(groups, "H200 ResNet-50 --grad-checkpointing") == ["h200:00002"]
    assert members(groups, "H200 ViT-B/16") == ["h200:00003"]
    assert members(groups, "H200 Mask R-CNN") == ["h200:00005"]
    assert members(groups, "H100 torchvision") == ["h100-80gb:00007"]
    assert len(members(groups, "all")) == len(ROWS)
