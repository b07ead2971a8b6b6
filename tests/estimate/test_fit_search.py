"""`peakmem fit`: the largest value of a script argument that fits, from a few estimates."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from peakmem.cli.main import main
from peakmem.estimate import api
from peakmem.estimate.api import Estimate, estimate_command
from peakmem.estimate.fit_search import (
    ArgRange,
    FitSpecError,
    Probe,
    find_largest,
    fit_command,
    parse_arg_range,
)
from peakmem.profiles import load_gpu

SCRIPTS = Path(__file__).parent.parent / "data" / "fit_scripts"
GIB = 2**30


# --- the spec -------------------------------------------------------------------------------

def test_parse_arg_range() -> None:
    assert parse_arg_range("batch_size=1..4096") == ArgRange("batch_size", 1, 4096)
    assert parse_arg_range(" seq = 128 .. 128 ") == ArgRange("seq", 128, 128)


@pytest.mark.parametrize(
    "spec", ["batch_size", "batch_size=1-4096", "=1..4", "1x=1..4", "b=4..1", "b=0..4", "b=a..b",
             "b=1..", "b=-3..4", ""],
)
def test_bad_arg_range(spec: str) -> None:
    with pytest.raises(FitSpecError):
        parse_arg_range(spec)


def test_placeholder_filled_inside_tokens() -> None:
    knob = ArgRange("k", 1, 9)
    assert knob.command_for(["python", "t.py", "--bs={k}", "--n", "{k}000"], 7) == [
        "python", "t.py", "--bs=7", "--n", "7000"]
    with pytest.raises(FitSpecError, match=r"\{k\}"):
        knob.check_command(["python", "t.py", "--bs", "8"])


# --- the search against brute force, on synthetic peaks ---------------------------------------

def _search(peak, low: int, high: int, capacity: int, slope_hint=None):
    calls: list[int] = []

    def measure(value: int) -> Probe:
        calls.append(value)
        size = peak(value)
        return Probe(value, size, size <= capacity)

    return find_largest(measure, low, high, capacity, "gpu", slope_hint=slope_hint), calls


def _brute(peak, low: int, high: int, capacity: int) -> int | None:
    fitting = [v for v in range(low, high + 1) if peak(v) <= capacity]
    return max(fitting) if fitting else None


PEAKS = {
    "linear": lambda v: 2 * GIB + v * 37 * 2**20,
    "quadratic": lambda v: GIB + v * v * 2**20,
    "blocks": lambda v: GIB + math.ceil(v * 13 * 2**20 / (20 * 2**20)) * 20 * 2**20,
    "flat": lambda v: 3 * GIB,
    "flat then linear": lambda v: 3 * GIB + max(0, v - 300) * 64 * 2**20,
    "jump": lambda v: GIB if v < 77 else 100 * GIB,
}


@pytest.mark.parametrize("name", sorted(PEAKS))
@pytest.mark.parametrize("capacity", [GIB // 2, 8 * GIB, 24 * GIB, 80 * GIB])
def test_search_matches_brute_force(name: str, capacity: int) -> None:
    peak = PEAKS[name]
    answer, calls = _search(peak, 1, 1024, capacity)
    expected = _brute(peak, 1, 1024, capacity)
    assert answer.value == expected
    if expected is None:
        assert answer.next_value == 1 and answer.peak_bytes_with_margin is None
    elif expected == 1024:
        assert answer.next_value is None and answer.next_peak_bytes_with_margin is None
    else:
        assert answer.next_value == expected + 1
        assert answer.peak_bytes_with_margin == peak(expected) <= capacity
        assert answer.next_peak_bytes_with_margin == peak(expected + 1) > capacity
    assert len(calls) == len(set(calls))  # no value estimated twice
    assert len(calls) <= 24


def test_linear_growth_needs_few_estimates() -> None:
    answer, calls = _search(PEAKS["linear"], 1, 4096, 24 * GIB)
    assert answer.value == _brute(PEAKS["linear"], 1, 4096, 24 * GIB)
    assert len(calls) <= 5  # two points, the prediction and its neighbour (+1 spare)
    # a slope known from another GPU saves the second point
    _, hinted = _search(PEAKS["linear"], 1, 4096, 24 * GIB, slope_hint=37 * 2**20)
    assert len(hinted) <= 4


@settings(max_examples=60, deadline=None)
@given(
    base=st.integers(0, 4 * GIB), per=st.integers(1, 2**28), power=st.sampled_from([1.0, 1.3, 2.0]),
    low=st.integers(1, 50), span=st.integers(0, 3000), capacity=st.integers(GIB, 100 * GIB),
)
def test_search_matches_brute_force_monotone(base, per, power, low, span, capacity) -> None:
    def peak(v: int) -> int:
        return base + int(per * v**power) // (2 * 2**20) * (2 * 2**20)

    high = low + span
    answer, calls = _search(peak, low, high, capacity)
    assert answer.value == _brute(peak, low, high, capacity)
    assert len(calls) <= 40


# --- real estimates against a brute-force sweep ---------------------------------------------

def _sweep(command: list[str], knob: ArgRange, gpu: str) -> int | None:
    fitting = None
    for value in range(knob.low, knob.high + 1):
        result = api.estimate_command(knob.command_for(command, value), gpu=gpu, isolate=False)
        if result.fits and result.peak_bytes_with_margin <= result.capacity_bytes:
            fitting = value
    return fitting


@pytest.mark.parametrize(
    "command, knob, max_probes",
    [
        # the bundled example, its batch size in hundreds (one batch per epoch), with one wide
        # hidden layer (131,072: 2.1 GB of weights, gradients and Adam state; 3,400 samples
        # fit, 3,500 do not): its default shape fits 45,000 samples, and every sample's host
        # indexing goes through the capture (92,000 ops, ~4.7 s of CPU an estimate at 46,000;
        # 0.2-0.4 s here)
        ([sys.executable, "-m", "peakmem.examples.mlp_train", "--hidden", "131072", "--depth",
          "1", "--batch-size", "{k}00", "--samples", "{k}00", "--epochs", "1"],
         ArgRange("k", 32, 35), 4),
        # a transformers causal LM, its batch size
        ([sys.executable, str(SCRIPTS / "hf_causal_lm.py"), "--batch-size", "{batch_size}"],
         ArgRange("batch_size", 1, 10), 6),
    ],
    ids=["mlp_example", "transformers_llama"],
)
def test_fit_matches_sweep(command: list[str], knob: ArgRange, max_probes: int,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    # each command is estimated once: the fit's probes get the sweep's own estimates (what is
    # checked is the search over them), not a second capture of the same command
    estimates: dict[tuple[str, ...], Estimate] = {}
    estimate_once = estimate_command

    def remembered(argv: list[str], *, gpu: object, **kwargs: object) -> Estimate:
        key = (str(getattr(gpu, "name", gpu)), *argv)
        if key not in estimates:
            estimates[key] = estimate_once(argv, gpu=gpu, **kwargs)  # type: ignore[arg-type]
        return estimates[key]

    monkeypatch.setattr(api, "estimate_command", remembered)
    expected = _sweep(command, knob, "rtx4060-8gb")
    assert len(estimates) == knob.high - knob.low + 1
    assert expected is not None and knob.low < expected < knob.high  # the range brackets it
    probes: list[int] = []
    [answer] = fit_command(command, knob, [load_gpu("rtx4060-8gb")], isolate=False,
                           on_probe=lambda gpu, value, n: probes.append(value))
    assert answer.value == expected
    assert answer.next_value == expected + 1
    assert answer.peak_bytes_with_margin <= load_gpu("rtx4060-8gb").total_memory_bytes
    assert answer.next_peak_bytes_with_margin > load_gpu("rtx4060-8gb").total_memory_bytes
    assert len(probes) <= max_probes
    assert len(estimates) == knob.high - knob.low + 1  # every probe was a value of the sweep


# --- the command ----------------------------------------------------------------------------

def test_fit_cli_json_several_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # the probes in this process, the job's prints on stderr as the child's would be (what is
    # checked is the command's search and JSON; a child process per probe: the next tests)
    def in_this_process(argv: list[str], **kwargs: object) -> Estimate:
        with contextlib.redirect_stdout(sys.stderr):
            return estimate_command(argv, **{**kwargs, "isolate": False})  # type: ignore[arg-type]

    monkeypatch.setattr(api, "estimate_command", in_this_process)
    result = CliRunner().invoke(main, [
        "fit", "--gpu", "rtx4060-8gb,l4", "--arg", "blocks=1..60", "--json", "--",
        sys.executable, str(SCRIPTS / "tensor_knob.py"), "--blocks", "{blocks}"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["arg"] == "blocks"
    assert [row["gpu"] for row in data["results"]] == ["rtx4060-8gb", "l4"]
    for row in data["results"]:
        assert set(row) == {"gpu", "value", "peak_bytes_with_margin", "next_value",
                            "next_peak_bytes_with_margin"}
        capacity = load_gpu(row["gpu"]).total_memory_bytes
        assert row["peak_bytes_with_margin"] <= capacity < row["next_peak_bytes_with_margin"]
        assert row["next_value"] == row["value"] + 1
    # 512 MiB per block: about 14 fit in 8 GiB, about 42 in the L4's 22 GiB
    assert 12 <= data["results"][0]["value"] <= 15
    assert set(data) == {"arg", "results"}


@pytest.mark.parametrize(
    "args, match",
    [
        (["--arg", "blocks=1-40", "--", "python", "t.py", "{blocks}"], "NAME=LOW..HIGH"),
        (["--arg", "blocks=1..40", "--", "python", "t.py", "--blocks", "3"], "placeholder"),
        (["--gpu", "a100-99gb", "--arg", "b=1..4", "--", "python", "t.py", "{b}"], "unknown GPU"),
        (["--arg", "b=1..4", "--", "python", "missing_script.py", "{b}"], "script not found"),
    ],
)
def test_fit_cli_bad_input(args: list[str], match: str) -> None:
    result = CliRunner().invoke(main, ["fit", "--json", *args])
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "bad_input" and match in error["message"]


def test_fit_cli_job_failure_names_the_value(tmp_path: Path) -> None:
    script = tmp_path / "boom.py"
    script.write_text("import sys\nif int(sys.argv[1]) > 0:\n    raise ValueError('bad knob')\n")
    result = CliRunner().invoke(main, ["fit", "--arg", "n=1..3", "--", sys.executable,
                                       str(script), "{n}"])
    assert result.exit_code == 1
    assert "at n=1 on h100-80gb: the job raised ValueError: bad knob" in result.stderr
