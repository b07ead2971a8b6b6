from __future__ import annotations

import os
import sys

import pytest
import torch

from peakmem.jobs.runner import JobSpec, JobSpecError, JobStatus, run_job
from peakmem.jobs.stop import StepLimitReached, is_step_limit, stop_after_steps
from tests.measure.conftest import TRAIN_LOOP


@pytest.mark.parametrize(
    ("argv", "script", "module", "args"),
    [
        (["python", "train.py", "--x", "1"], "train.py", None, ("--x", "1")),
        ([sys.executable, "-u", "t.py"], "t.py", None, ()),
        (["t.py", "-m", "z"], "t.py", None, ("-m", "z")),
        (["python", "-m", "pkg.mod", "a"], None, "pkg.mod", ("a",)),
        (["python", "-W", "ignore", "-X", "dev", "t.py", "-W"], "t.py", None, ("-W",)),
        (["python", "-Wignore::UserWarning", "-u", "-m", "pkg"], None, "pkg", ()),
        (["-mpkg", "b"], None, "pkg", ("b",)),
    ],
)
def test_spec_parse(argv, script, module, args):
    spec = JobSpec.parse(argv)
    assert (spec.script, spec.module, spec.args) == (script, module, args)


@pytest.mark.parametrize(
    "argv", [[], ["python"], ["python", "-m"], ["python", "-c", "x"], ["python", "-W"]]
)
def test_spec_parse_rejects(argv):
    with pytest.raises(JobSpecError):
        JobSpec.parse(argv)


def test_stops_after_n_steps(write_script, capsys):
    path = write_script(TRAIN_LOOP)
    outcome = run_job(JobSpec(script=str(path)), steps=3)
    assert outcome.status is JobStatus.STOPPED
    assert outcome.steps == 3 and outcome.ok
    assert "DONE" not in capsys.readouterr().out  # stopped before the loop ended


def test_script_shorter_than_limit_finishes(write_script, capsys):
    path = write_script(TRAIN_LOOP)
    outcome = run_job(JobSpec(script=str(path), args=("2",)), steps=5)
    assert outcome.status is JobStatus.FINISHED and outcome.steps == 2
    assert "DONE 2" in capsys.readouterr().out


def test_argv_and_name_as_python_gives(write_script, capsys):
    path = write_script(
        """
        import sys, os
        print("ARGV", sys.argv, __name__, os.path.dirname(os.path.abspath(__file__)) == sys.path[0])
        """
    )
    saved = sys.argv[:]
    outcome = run_job(JobSpec(script=str(path), args=("--a", "b")))
    assert outcome.status is JobStatus.FINISHED
    out = capsys.readouterr().out
    assert f"ARGV {[str(path), '--a', 'b']} __main__ True" in out
    assert sys.argv == saved


def test_module_form(write_script, monkeypatch, capsys):
    path = write_script("import sys\nprint('MOD', sys.argv[1:], __name__)\n", name="zoo_mod_x.py")
    monkeypatch.chdir(path.parent)
    outcome = run_job(JobSpec(module="zoo_mod_x", args=("q",)))
    assert outcome.status is JobStatus.FINISHED
    assert "MOD ['q'] __main__" in capsys.readouterr().out


def test_user_error_traceback_is_trimmed(write_script):
    path = write_script("def boom():\n    raise KeyError('nope')\n\nboom()\n")
    outcome = run_job(JobSpec(script=str(path)))
    assert outcome.status is JobStatus.ERROR and outcome.exit_code == 1
    assert isinstance(outcome.error, KeyError)
    assert "in boom" in outcome.traceback_text and "KeyError: 'nope'" in outcome.traceback_text
    assert "runpy" not in outcome.traceback_text and "runner.py" not in outcome.traceback_text


@pytest.mark.parametrize(
    ("code", "status", "exit_code"),
    [("0", JobStatus.FINISHED, 0), ("3", JobStatus.ERROR, 3), ("'msg'", JobStatus.ERROR, 1)],
)
def test_sys_exit(write_script, code, status, exit_code):
    path = write_script(f"import sys\nsys.exit({code})\n")
    outcome = run_job(JobSpec(script=str(path)))
    assert (outcome.status, outcome.exit_code) == (status, exit_code)


def test_except_exception_cannot_swallow_the_stop(write_script):
    path = write_script(
        """
        import torch
        p = torch.nn.Parameter(torch.ones(1))
        opt = torch.optim.SGD([p], lr=0.1)
        n = 0
        while n < 50:
            try:
                p.grad = torch.ones(1)
                opt.step()
            except Exception:
                pass
            n += 1
        raise RuntimeError("the stop was swallowed")
        """
    )
    outcome = run_job(JobSpec(script=str(path)), steps=2)
    assert outcome.status is JobStatus.STOPPED and outcome.steps == 2


def test_timeout(write_script):
    path = write_script("import time\nwhile True:\n    time.sleep(0.01)\n")
    outcome = run_job(JobSpec(script=str(path)), timeout=0.3)
    assert outcome.status is JobStatus.TIMEOUT and outcome.exit_code == 124


def test_timeout_swallowed_in_a_weakref_callback_is_raised_again(write_script, monkeypatch):
    # the alarm goes off while a weakref callback runs (as the capture's storage watches do
    # when a tensor dies): Python prints "Exception ignored in" and goes on, so a one-shot
    # alarm let the job run to its end past its limit (a 120 s limit, 260 s run)
    import peakmem.jobs.runner as runner

    monkeypatch.setattr(runner, "TIME_LIMIT_RETRY_S", 0.1)
    path = write_script(
        """
        import time, weakref

        class Blob:
            pass

        def slow_callback(_ref):
            time.sleep(0.5)  # the limit (0.2 s) expires in here

        blob = Blob()
        watch = weakref.ref(blob, slow_callback)
        del blob
        start = time.monotonic()
        while time.monotonic() - start < 3:
            time.sleep(0.01)
        raise SystemExit(7)  # reached only if the limit was lost
        """
    )
    outcome = run_job(JobSpec(script=str(path)), timeout=0.2)
    assert outcome.status is JobStatus.TIMEOUT and outcome.exit_code == 124
    assert outcome.seconds < 2
    assert outcome.seconds < 5


def test_missing_script():
    with pytest.raises(JobSpecError, match="not found"):
        run_job(JobSpec(script="/nonexistent/train.py"))


def test_stop_hook_removed_and_counts_every_optimizer():
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    opt_a, opt_b = torch.optim.SGD([a], lr=1), torch.optim.Adam([b])
    a.grad, b.grad = torch.ones(1), torch.ones(1)
    seen = []
    with pytest.raises(StepLimitReached) as info, stop_after_steps(3, on_step=seen.append) as c:
        opt_a.step()
        opt_b.step()
        opt_a.step()
    assert is_step_limit(info.value) and c.steps == 3 and seen == [1, 2, 3]
    opt_a.step()  # the hook is gone: no raise, no count
    assert c.steps == 3


def test_stop_rejects_bad_limit():
    with pytest.raises(ValueError), stop_after_steps(0):
        pass


def test_a_later_job_imports_its_own_local_module_of_the_same_name(tmp_path):
    # two in-process jobs, each with a `helpers.py` next to its script (LLMs-from-scratch's
    # chapters each ship a `previous_chapters.py`): the second got the first's cached module
    for name, function in (("first", "only_in_first"), ("second", "only_in_second")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "helpers.py").write_text(f"def {function}():\n    return {name!r}\n")
        (folder / "train.py").write_text(
            f"from helpers import {function}\nassert {function}() == {name!r}\n")
    assert "helpers" not in sys.modules
    for name in ("first", "second"):
        outcome = run_job(JobSpec(script=str(tmp_path / name / "train.py")))
        assert outcome.status is JobStatus.FINISHED, outcome.error
    assert "helpers" not in sys.modules


def test_a_jobs_environment_variables_do_not_reach_the_next_job(tmp_path, monkeypatch):
    # peft's prefix-tuning guide sets `os.environ["CUDA_VISIBLE_DEVICES"] = "3"` at its top; run
    # in-process, that reached a later DeepSpeed job, whose NVML lookup of device 3 failed
    monkeypatch.setenv("PEAKMEM_TEST_KEPT", "before")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    first = tmp_path / "first.py"
    first.write_text("import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '3'\n"
                     "os.environ['PEAKMEM_TEST_KEPT'] = 'changed'\n"
                     "os.environ['PEAKMEM_TEST_ADDED'] = '1'\n")
    second = tmp_path / "second.py"
    second.write_text("import os\nassert 'CUDA_VISIBLE_DEVICES' not in os.environ\n"
                      "assert os.environ['PEAKMEM_TEST_KEPT'] == 'before'\n"
                      "del os.environ['PEAKMEM_TEST_KEPT']\n")
    for script in (first, second):
        outcome = run_job(JobSpec(script=str(script)))
        assert outcome.status is JobStatus.FINISHED, outcome.error
    assert os.environ.get("PEAKMEM_TEST_KEPT") == "before"  # removed by the job: put back
    assert "PEAKMEM_TEST_ADDED" not in os.environ and "CUDA_VISIBLE_DEVICES" not in os.environ
