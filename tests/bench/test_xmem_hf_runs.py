"""benchmarks/xmem_hf_runs.py: the per-model summary of held-out runs that did not OOM, and the
per-run peak differences between two of its files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "xmem_hf_runs.py"
MIB = 2**20


@pytest.fixture(scope="module")
def runs():
    spec = importlib.util.spec_from_file_location("xmem_hf_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _record(row_id, model, measured_mib, compared_mib, split=False, status="ok", allocated_mib=0):
    return {"row_id": row_id, "model": model, "split": split, "status": status,
            "measured": measured_mib * MIB, "compared": compared_mib * MIB,
            "allocated": allocated_mib * MIB,
            "signed": (compared_mib - measured_mib) / measured_mib}


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_summary_counts_only_held_out_runs_that_ran(runs, tmp_path, capsys):
    out = tmp_path / "runs.jsonl"
    _write(out, [
        _record("1", "gpt2", 1000, 1100),
        _record("2", "gpt2", 2000, 1900),
        _record("3", "gpt2", 1000, 5000, split=True),  # the calibration split: left out
        _record("4", "gpt2", 1000, 9000, status="oom"),  # OOM: a lower bound, left out
        {"row_id": "5", "error": "no config"},
    ])
    runs.summary(out)
    lines = capsys.readouterr().out.splitlines()
    assert "| gpt2 | 2 | -100 / +0 / +100 | +2.5% | 1 |" in lines
    assert lines[-1] == "| all | 2 | -100 / +0 / +100 | +2.5% | 1 |"


def test_against_prints_the_range_of_per_run_differences(runs, tmp_path, capsys):
    mine, theirs = tmp_path / "mine.jsonl", tmp_path / "theirs.jsonl"
    _write(mine, [_record("1", "t5", 100, 130, allocated_mib=120),
                  _record("2", "t5", 100, 90, allocated_mib=80)])
    _write(theirs, [_record("1", "t5", 100, 100, allocated_mib=100),
                    _record("2", "t5", 100, 100, allocated_mib=100),
                    _record("3", "t5", 100, 100, allocated_mib=100)])  # only in one file
    runs.against(mine, theirs)
    out = capsys.readouterr().out
    assert "allocated: mine.jsonl - theirs.jsonl over 2 runs: -20 / +0 / +20 MiB" in out
    assert "compared: mine.jsonl - theirs.jsonl over 2 runs: -10 / +10 / +30 MiB" in out
