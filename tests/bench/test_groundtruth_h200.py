"""The H200 runs of benchmarks/groundtruth/h200.csv (torch 2.11): the h200 GPU profile and the
torch-2.11 stack's h200 entries hold what the declared calibration split measured, and nothing
from the held-out runs."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

import pytest

from peakmem.bench.calibration import GROUNDTRUTH_SPLIT_CLOSED_AT, in_calibration_split, split_key
from peakmem.datasets.loaders import load_rows
from peakmem.profiles import load_gpu, load_stack

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "groundtruth_context.py"


@pytest.fixture(scope="module")
def context_script():
    spec = importlib.util.spec_from_file_location("groundtruth_context", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def h200_rows():
    return [r for r in load_rows("groundtruth") if r.gpu == "h200"]


def test_the_split_holds_a_fifth_of_the_h200_runs(h200_rows):
    split = [r for r in h200_rows if in_calibration_split(r)]
    assert (len(h200_rows), len(split)) == (330, 32)
    hf = [r for r in split if r.family == "transformers_lm"]
    assert len(hf) == 9
    # the rows of the later leases (2026-11-27 21:31-21:43, four sweeps side by side) are all held
    # out: the stack's constants were fitted before they were measured
    late = [r for r in h200_rows if r.features["measured_at"] >= GROUNDTRUTH_SPLIT_CLOSED_AT]
    assert len(late) == 189 and not any(in_calibration_split(r) for r in late)
    hashed_in = [r for r in late if int(hashlib.sha1(split_key(r).encode()).hexdigest(), 16) % 100 < 20]
    assert hashed_in  # the date, not the hash, keeps them out


def test_stack_and_profile_hold_the_split_figures(context_script, h200_rows):
    found = context_script.split_context(h200_rows, "h200")
    stack, gpu = load_stack("2.11"), load_gpu("h200")
    assert stack.context["h200"].value == found.context_bytes == 778043392
    # under lazy loading the estimate's context is the first-use model's base instead
    # (estimate/first_use.py): the split's fp32 figure is that base + the families those jobs run
    assert stack.context_for(gpu, environ={}).value == 610 * 2**20
    assert stack.library_bytes_for(gpu, "cudnn_convolution").value == (
        found.convolution_library_bytes) == 20 * 2**20
    assert found.total_bytes == {gpu.total_memory_bytes}
    assert stack.lazy_loaded_for(gpu).value == found.context_bytes - 543162368


def test_split_context_reads_only_the_split(context_script, h200_rows):
    held_out = [r for r in h200_rows if not in_calibration_split(r)]
    with pytest.raises(ValueError, match="no h200 run without cuDNN convolutions"):
        context_script.split_context(held_out, "h200")
    assert context_script.precision_of("--model gpt2 --precision bf16 --batch-size 2") == "bf16"
    assert context_script.precision_of("--model gpt2") == "fp32"
