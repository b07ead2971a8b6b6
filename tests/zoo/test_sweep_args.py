"""Every run of every committed sweep passes its script's argument parser (no typo in a knob
reaches the GPU), and every GPUMemNet configuration parses."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from peakmem.jobs.runner import JobSpec, run_job
from peakmem.measure.sweep_plan import load_plan

REPO = Path(__file__).resolve().parents[2]
SWEEPS = sorted((REPO / "benchmarks" / "sweeps").glob("*.toml"))
from peakmem.datasets.gpumemnet_jobs import parse_job  # noqa: E402


class _Parsed(BaseException):  # noqa: N818 - a control-flow signal
    pass


@pytest.fixture
def stop_after_parse(monkeypatch):
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.stem)
def test_every_run_parses(sweep, stop_after_parse, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    plan = load_plan(sweep)
    for run in plan.runs:
        outcome = run_job(JobSpec(script=run.job, args=run.args))
        assert isinstance(outcome.error, _Parsed), (run.job, run.args, capsys.readouterr().err)
        if run.job.endswith("gpumemnet.py"):
            config = run.args[run.args.index("--config") + 1]
            assert parse_job(config).family in ("mlp", "cnn", "transformer")
