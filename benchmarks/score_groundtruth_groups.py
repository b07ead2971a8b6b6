"""Summaries of a `score_groundtruth.py --out` file by group of ground-truth rows (Hugging Face
rows by GPU, model family and precision; torchvision rows by GPU, model kind and training knob),
with the same figures as its summary lines. A group no row of the file belongs to is not printed.

    PYTHONPATH=src python benchmarks/score_groundtruth_groups.py RESULTS.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from score_groundtruth import summary

VISION_JOBS = ("vision.py", "detection.py")  # benchmarks/zoo's torchvision jobs
VISION_TRANSFORMERS = ("--model vit_", "--model swin_")


def _vision(r: dict) -> bool:
    return r.get("job", "").endswith(VISION_JOBS)


def _hf(key: str, r: dict, gpu: str) -> bool:
    return key.startswith(gpu) and "args" in r and not _vision(r)


def _zoo_cnn(key: str, r: dict) -> bool:
    """An H200 torchvision CNN row of issue 6's target: not ViT / Swin, not RegNet (a capture
    gap, docs/capture.md), not a detection model."""
    args = r.get("args", "")
    return (key.startswith("h200:") and r.get("job", "").endswith("vision.py")
            and not any(m in args for m in VISION_TRANSFORMERS) and "regnet" not in args)


GROUPS: dict[str, Callable[[str, dict], bool]] = {
    "H200 BERT / GPT-2 fp32": lambda key, r: _hf(key, r, "h200:") and "t5-" not in r["args"]
    and "fp32" in r["args"],
    "H200 BERT / GPT-2 bf16": lambda key, r: _hf(key, r, "h200:") and "t5-" not in r["args"]
    and "bf16" in r["args"],
    "H200 T5 fp32 / bf16": lambda key, r: _hf(key, r, "h200:") and "t5-" in r["args"],
    "H100 (seq 128)": lambda key, r: _hf(key, r, "h100-80gb:"),
    "H200 zoo CNNs (RegNet left out)": _zoo_cnn,
    "H200 zoo CNNs, plain (no knob)": lambda key, r: _zoo_cnn(key, r)
    and "--precision fp16" not in r["args"]
    and not any(k in r["args"] for k in ("--grad-checkpointing", "--optimizer")),
    "H200 ResNet-50 --grad-checkpointing": lambda key, r: _zoo_cnn(key, r)
    and "--grad-checkpointing" in r["args"],
    "H200 ResNet-50 --optimizer sgd / adam": lambda key, r: _zoo_cnn(key, r)
    and "--optimizer" in r["args"],
    "H200 ResNet-50 fp16 (GradScaler)": lambda key, r: _zoo_cnn(key, r)
    and "--precision fp16" in r["args"],
    "H200 ViT-B/16": lambda key, r: key.startswith("h200:") and "--model vit_" in r.get("args", ""),
    "H200 Swin-T": lambda key, r: key.startswith("h200:") and "--model swin_" in r.get("args", ""),
    "H200 Mask R-CNN": lambda key, r: key.startswith("h200:")
    and r.get("job", "").endswith("detection.py"),
    "H100 torchvision": lambda key, r: key.startswith("h100-80gb:") and _vision(r),
    "all": lambda key, r: True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    results = json.loads(parser.parse_args().results.read_text())
    for name, member in GROUPS.items():
        members = {key: r for key, r in results.items() if member(key, r)}
        if not members:
            continue
        part = {key: r for key, r in members.items() if "error" not in r}
        failed = len(members) - len(part)
        print(f"{name} ({len(part)} rows" + (f", {failed} not estimated)" if failed else ")"))
        for line in summary(part)[1:]:
            print("   ", line)


if __name__ == "__main__":
    main()
