import textwrap

import pytest

from peakmem.capture import capture_command
from peakmem.jobs.runner import JobSpec, JobSpecError


def write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


TRAIN = """
    import sys
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Linear(8, 4).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    print("args", sys.argv[1:])
    for step in range(1000):
        loss = model(torch.randn(2, 8, device=device)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"step {step} loss {loss.item():.3f}")
"""


def test_script_runs_unchanged_with_its_arguments_and_stops(tmp_path, a100, stack24, capsys):
    script = write(tmp_path, "train.py", TRAIN)
    result = capture_command(["python", str(script), "--lr", "3"], gpu=a100, stack=stack24, steps=2)
    assert result.error is None, result.error_text
    assert result.steps == 2 and result.stopped
    out = capsys.readouterr().out
    assert "args ['--lr', '3']" in out and "step 0 loss 0.000" in out


def test_module_form(tmp_path, a100, stack24, monkeypatch):
    write(tmp_path, "mytrain.py", TRAIN)
    monkeypatch.chdir(tmp_path)
    result = capture_command(["python", "-m", "mytrain"], gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert result.steps == 1


def test_a_failing_script_reports_its_own_traceback(tmp_path, a100, stack24):
    script = write(
        tmp_path,
        "bad.py",
        """
        def load():
            raise ValueError("no such dataset")
        load()
        """,
    )
    result = capture_command(["python", str(script)], gpu=a100, stack=stack24)
    assert result.exit_code == 1
    assert "ValueError: no such dataset" in result.error_text
    assert "bad.py" in result.error_text and "in load" in result.error_text
    assert "peakmem" not in result.error_text


def test_sys_exit_codes(tmp_path, a100, stack24):
    ok = capture_command(["python", str(write(tmp_path, "ok.py", "import sys; sys.exit(0)"))], gpu=a100, stack=stack24)
    assert ok.error is None
    bad = capture_command(["python", str(write(tmp_path, "no.py", "import sys; sys.exit(3)"))], gpu=a100, stack=stack24)
    assert bad.exit_code == 3


def test_a_script_that_never_steps_gets_a_forward_estimate(tmp_path, a100, stack24):
    script = write(
        tmp_path,
        "infer.py",
        """
        import torch
        model = torch.nn.Linear(8, 4).cuda().eval()
        with torch.no_grad():
            model(torch.randn(3, 8).cuda())
        """,
    )
    result = capture_command(["python", str(script)], gpu=a100, stack=stack24)
    assert result.error is None and not result.trained
    assert any("forward" in note for note in result.notes)


def test_timeout_stops_a_job_that_runs_too_long(tmp_path, a100, stack24):
    script = write(tmp_path, "spin.py", "while True:\n    pass\n")
    result = capture_command(["python", str(script)], gpu=a100, stack=stack24, timeout=0.5)
    assert result.exit_code == 124 and "ran past the time limit" in result.error_text


@pytest.mark.parametrize(
    "argv, target, is_module, args",
    [
        (["python", "t.py", "-x"], "t.py", False, ("-x",)),
        (["python3", "-u", "-m", "pkg.mod", "a"], "pkg.mod", True, ("a",)),
        (["t.py"], "t.py", False, ()),
    ],
)
def test_command_parsing(tmp_path, monkeypatch, argv, target, is_module, args):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    spec = JobSpec.parse(argv)
    assert (spec.module or spec.script, spec.module is not None, spec.args) == (
        target,
        is_module,
        args,
    )


@pytest.mark.parametrize("argv", [[], ["python"], ["python", "missing.py"], ["python", "-c", "1"]])
def test_bad_commands_are_one_line_errors(tmp_path, monkeypatch, argv, a100, stack24):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(JobSpecError):
        capture_command(argv, gpu=a100, stack=stack24)
