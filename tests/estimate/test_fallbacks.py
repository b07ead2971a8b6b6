"""Fallbacks named where they happen; assumptions in one line; unknown options refused."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

import peakmem.estimate
from peakmem.cli.main import main
from peakmem.estimate.fallbacks import assumptions_line, gpu_alias_note, stack_note
from peakmem.profiles import load_gpu, load_stack

EXAMPLE = [sys.executable, "-m", "peakmem.examples.mlp_train", "--epochs", "1", "--hidden", "256"]


def test_gpu_alias_named() -> None:
    note = gpu_alias_note("a100", load_gpu("a100"))
    assert note is not None and note.startswith("--gpu a100 is a100-40gb")
    assert "a100-80gb" in note
    assert gpu_alias_note("a100-40gb", load_gpu("a100-40gb")) is None
    assert gpu_alias_note("H100-80GB", load_gpu("h100-80gb")) is None


@pytest.mark.parametrize("version, own", [("2.4.1", True), ("2.5.0", True), ("2.6.0", True),
                                           ("2.13.0", False), ("2.8.0", False)])
def test_stack_fallback_named(version: str, own: bool) -> None:
    stack = load_stack(version)
    note = stack_note(version, stack)
    if own:
        assert note is None
    else:
        assert note is not None and f"torch {version} has no stack profile" in note
        assert stack.name in note


def test_assumptions_line() -> None:
    assert assumptions_line([]) is None
    line = assumptions_line([
        "CUDA context: 419430400 (assumed: 400 MiB: typical context)",
        "safety margin: 0.015 (assumed: carried over)",
        "2 host read(s) of device values (.item(), ...) saw zeros; if they steer ...",
    ])
    assert line == ("3 assumption(s): CUDA context, safety margin, 2 host read(s) of device "
                    "values (--verbose or --json lists them)")


@pytest.fixture
def in_process(monkeypatch):
    """The CLI's estimates run in this process (faster than a supervised child)."""
    real = peakmem.estimate.estimate_command

    def run(argv, **kwargs):
        kwargs.pop("job_log", None)
        kwargs.pop("sandbox", None)
        kwargs.pop("max_host_memory", None)
        return real(argv, isolate=False, **kwargs)

    monkeypatch.setattr(peakmem.estimate, "estimate_command", run)


def test_output_names_fallbacks_and_summarises_assumptions(in_process) -> None:
    out = CliRunner().invoke(main, ["estimate", "--gpu", "a100", "--", *EXAMPLE])
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())  # rich wraps lines
    assert "--gpu a100 is a100-40gb" in text
    assert "FACTS.md" not in text and "calibrate_" not in text
    assert text.count("assumed:") == 1 and "(--verbose or --json lists them)" in text
    verbose = CliRunner().invoke(main, ["estimate", "--gpu", "a100", "--verbose", "--", *EXAMPLE])
    assert verbose.exit_code == 0
    listed = [line for line in verbose.stdout.splitlines() if line.startswith("assumed:")]
    assert len(listed) >= 2
    out = CliRunner().invoke(main, ["estimate", "--gpu", "a100", "--json", "--", *EXAMPLE])
    data = json.loads(out.stdout.strip().splitlines()[-1])  # in process, the job prints too
    assert len(data["assumptions"]) == len(listed)
    assert any(note.startswith("--gpu a100 is a100-40gb") for note in data["notes"])
    assert not any("FACTS.md" in item or "calibrate_" in item for item in data["assumptions"])


@pytest.mark.parametrize("flags", [["--gpus", "a100"], ["--gpus=a100"], ["--tiemout", "3"]])
@pytest.mark.parametrize("as_json", [False, True])
def test_unknown_option_is_refused_by_name(flags: list[str], as_json: bool) -> None:
    args = ["estimate", *(["--json"] if as_json else []), *flags, "--", *EXAMPLE]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2
    option = flags[0].split("=")[0]
    message = json.loads(out.stdout)["error"]["message"] if as_json else out.stderr
    assert f"no such option: {option}" in message
    assert "unsupported python option" not in message
    if option != "--tiemout":
        assert "did you mean --gpu?" in message


def test_job_options_after_the_separator_are_the_jobs() -> None:
    out = CliRunner().invoke(main, ["estimate", "--json", "--", "--gpus", "t.py"])
    assert out.exit_code == 2
    assert "no such option" not in json.loads(out.stdout)["error"]["message"]
    out = CliRunner().invoke(main, ["estimate", "--gpus=a100", "python", "t.py"])
    assert out.exit_code == 2 and "no such option: --gpus" in out.stderr
