"""Summaries of a `score_groundtruth.py --out` file by group of Hugging Face ground-truth rows
(GPU, model family, precision), with the same figures as its summary lines.

    PYTHONPATH=src python benchmarks/score_groundtruth_groups.py RESULTS.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from score_groundtruth import summary

GROUPS: dict[str, Callable[[str, dict], bool]] = {
    "H200 BERT / GPT-2 fp32": lambda key, r: key.startswith("h200:") and "t5-" not in r["args"]
    and "fp32" in r["args"],
    "H200 BERT / GPT-2 bf16": lambda key, r: key.startswith("h200:") and "t5-" not in r["args"]
    and "bf16" in r["args"],
    "H200 T5 fp32 / bf16": lambda key, r: key.startswith("h200:") and "t5-" in r["args"],
    "H100 (seq 128)": lambda key, r: key.startswith("h100-80gb:"),
    "all": lambda key, r: True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    results = json.loads(parser.parse_args().results.read_text())
    for name, member in GROUPS.items():
        part = {key: r for key, r in results.items() if "error" not in r and member(key, r)}
        print(f"{name} ({len(part)} rows)")
        for line in summary(part)[1:]:
            print("   ", line)


if __name__ == "__main__":
    main()
