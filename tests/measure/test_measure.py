from __future__ import annotations

import io
import json
import os
import threading
import time

import pytest
from click.testing import CliRunner

import peakmem.cli.measure as cli_measure
from peakmem.cli.main import main
from peakmem.jobs.runner import JobSpec
from peakmem.measure.fake_probe import FakeProbe
from peakmem.measure.probe import DeviceProbe, UsedSample
from peakmem.measure.result import JSON_KEYS, MeasureStatus, allocator_config
from peakmem.measure.sampler import PeakSampler
from peakmem.measure.session import MeasureOptions, NoGPUError, is_oom_error, measure_job
from tests.measure import fakejob_state

MiB = 2**20

# a "training job" that drives the fake device: a short used-memory spike in step 2
FAKE_JOB = """
import sys, time
import torch
from tests.measure import fakejob_state
probe = fakejob_state.PROBE
mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
p = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([p], lr=0.1)
probe.set_used(500 * 2**20, reserved=0)
for step in range(10):
    p.grad = torch.ones(2)
    if step == 1:
        probe.set_used(3000 * 2**20, reserved=2400 * 2**20)
        probe.max_allocated = 2000 * 2**20
        time.sleep(0.05)
        probe.set_used(2900 * 2**20, reserved=2400 * 2**20)
    if mode == "oom" and step == 2:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if mode == "boom" and step == 2:
        raise ValueError("user bug")
    if mode == "reset" and step == 3:
        probe.reset_peak()  # torch.cuda.reset_peak_memory_stats(), after the step-1 spike
    if mode == "null" and step == 1:
        raise SystemError("<built-in method dropout of type object at 0x7f47> returned NULL"
                          " without setting an exception")
    print("step", step)
    opt.step()
"""


@pytest.fixture
def fake(write_script):
    probe = FakeProbe()
    fakejob_state.PROBE = probe
    path = write_script(FAKE_JOB)
    yield probe, path
    fakejob_state.PROBE = None


def test_fake_probe_satisfies_protocol():
    assert isinstance(FakeProbe(), DeviceProbe)


def test_measure_ok_records_peak_and_context(fake):
    probe, path = fake
    result = measure_job(JobSpec(script=str(path)), probe, MeasureOptions(steps=3, sample_hz=500))
    assert result.status is MeasureStatus.OK and result.steps == 3
    assert result.peak_bytes == 3000 * MiB  # the 50 ms spike is caught by the sampler
    assert result.peak_reserved_bytes == 2400 * MiB
    assert result.peak_allocated_bytes == 2000 * MiB
    assert result.context_bytes == 500 * MiB  # 2900 used - 2400 reserved at the end
    assert result.samples > 5 and result.peak_source == "nvml-process"
    assert probe.events[0] == "baseline" and "synchronize" in probe.events


def test_a_job_resetting_the_peak_counters_still_gets_the_runs_peak(fake):
    """p_batch_from_memory on the H200 (2026-11-28) resets the counters every epoch: torch's
    max reserved at the end said 96.8 GiB, the run's was ~121.8 GiB (NVML's peak minus the
    context). The maxima read before each reset count."""
    probe, path = fake
    result = measure_job(JobSpec(script=str(path), args=("reset",)), probe, MeasureOptions(steps=6))
    assert probe.max_allocated == 0  # what torch.cuda.max_memory_allocated() says at the end
    assert result.peak_allocated_bytes == 2000 * MiB and result.peak_reserved_bytes == 2400 * MiB
    assert result.peak_resets == 1
    plain = measure_job(JobSpec(script=str(path)), FakeProbe(), MeasureOptions(steps=1))
    assert plain.peak_resets == 0


def test_measure_oom_is_a_status_not_a_crash(fake):
    probe, path = fake
    result = measure_job(JobSpec(script=str(path), args=("oom",)), probe, MeasureOptions())
    assert result.status is MeasureStatus.OOM and result.steps == 2
    assert "out of memory" in result.error
    assert result.peak_bytes == 3000 * MiB


def test_measure_user_error(fake, capsys):
    probe, path = fake
    result = measure_job(JobSpec(script=str(path), args=("boom",)), probe, MeasureOptions())
    assert result.status is MeasureStatus.ERROR and result.exit_code == 1
    assert "ValueError: user bug" in capsys.readouterr().err


def test_measure_redirects_job_stdout(fake, capsys):
    probe, path = fake
    sink = io.StringIO()
    measure_job(JobSpec(script=str(path)), probe, MeasureOptions(steps=1, job_stdout=sink))
    assert "step 0" in sink.getvalue() and "step 0" not in capsys.readouterr().out


def test_measure_snapshot(fake, tmp_path):
    probe, path = fake
    snap = tmp_path / "snap.pickle"
    result = measure_job(JobSpec(script=str(path)), probe, MeasureOptions(snapshot=snap))
    assert snap.read_text() == "fake snapshot" and result.snapshot == str(snap)
    assert probe.events.index("start_history") < probe.events.index("dump_history")


def test_a_job_broken_under_the_history_says_to_rerun_without_snapshot(fake, tmp_path):
    """Python 3.12 + torch 2.11 on the H200: two jobs failed with SystemError only while the
    allocator history recorded (session.SNAPSHOT_HINT); the error says so, and only then."""
    probe, path = fake
    snap = tmp_path / "snap.pickle"
    with_history = measure_job(JobSpec(script=str(path), args=("null",)), probe,
                               MeasureOptions(snapshot=snap))
    assert with_history.status is MeasureStatus.ERROR
    assert with_history.error.startswith("SystemError: <built-in method dropout")
    assert with_history.error.endswith("rerun without --snapshot]")
    without = measure_job(JobSpec(script=str(path), args=("null",)), probe, MeasureOptions())
    assert "--snapshot" not in without.error
    other = measure_job(JobSpec(script=str(path), args=("boom",)), probe,
                        MeasureOptions(snapshot=tmp_path / "other.pickle"))
    assert other.error == "ValueError: user bug"


def test_measure_without_gpu_raises(write_script):
    path = write_script("print(1)")
    with pytest.raises(NoGPUError, match="no driver"):
        measure_job(JobSpec(script=str(path)), FakeProbe(reason="no driver"), MeasureOptions())


def test_json_keys_in_order(fake):
    probe, path = fake
    data = measure_job(JobSpec(script=str(path)), probe, MeasureOptions(steps=1)).to_json()
    assert tuple(data)[: len(JSON_KEYS)] == JSON_KEYS
    assert data["status"] == "ok" and data["gpu"] == "Fake GPU"
    json.dumps(data)


def test_is_oom_error_follows_the_cause_chain():
    import torch

    assert is_oom_error(torch.cuda.OutOfMemoryError("x"))
    assert is_oom_error(RuntimeError("CUDA out of memory. Tried to allocate 20 MiB"))
    wrapped = ValueError("wrapper")
    wrapped.__cause__ = torch.cuda.OutOfMemoryError("x")
    assert is_oom_error(wrapped)
    assert not is_oom_error(RuntimeError("shape mismatch"))
    assert not is_oom_error(None)


def test_allocator_config_precedence():
    assert allocator_config({}) == ""
    assert allocator_config({"PYTORCH_ALLOC_CONF": "a:1"}) == "a:1"
    assert (
        allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "b:2", "PYTORCH_ALLOC_CONF": "a:1"}) == "b:2"
    )


def test_sampler_rate_and_last_sample():
    value = {"v": 1}
    sampler = PeakSampler(lambda: UsedSample(value["v"], "x"), hz=200).start()
    time.sleep(0.2)
    value["v"] = 7  # set right before stop: only the final sample can see it
    stats = sampler.stop()
    assert stats.peak_bytes == 7 and stats.peak_source == "x"
    assert stats.rate_hz >= 100 and stats.samples >= 20


def test_sampler_reports_read_failures():
    def broken() -> UsedSample:
        raise OSError("nvml gone")

    sampler = PeakSampler(broken, hz=200).start()
    time.sleep(0.02)
    with pytest.raises(RuntimeError, match="nvml gone"):
        sampler.stop()
    assert threading.active_count() >= 1


def test_sampler_rejects_bad_rate():
    with pytest.raises(ValueError):
        PeakSampler(lambda: UsedSample(0, "x"), hz=0)


# --- the command line ---


@pytest.fixture
def cli(fake, monkeypatch):
    probe, path = fake
    monkeypatch.setattr(cli_measure, "make_probe", lambda index: probe)
    return probe, path


def test_cli_json(cli, tmp_path):
    probe, path = cli
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        main, ["measure", "--json", "--steps", "2", "--out", str(out), "--", "python", str(path)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip())
    assert data["steps"] == 2 and data["peak_bytes"] == 3000 * MiB
    assert json.loads(out.read_text())["peak_bytes"] == 3000 * MiB
    assert "close" in probe.events


def test_cli_oom_exit_zero(cli):
    _, path = cli
    res = CliRunner().invoke(main, ["measure", "--json", "--", "python", str(path), "oom"])
    assert res.exit_code == 0 and json.loads(res.stdout.strip())["status"] == "oom"


def test_cli_error_exit_nonzero(cli):
    _, path = cli
    res = CliRunner().invoke(main, ["measure", "--json", "--", "python", str(path), "boom"])
    assert res.exit_code == 1 and json.loads(res.stdout.strip())["status"] == "error"


def test_cli_table(cli):
    _, path = cli
    res = CliRunner().invoke(main, ["measure", "--", str(path)])
    assert res.exit_code == 0 and "3,000.0 MiB" in res.stdout


def test_cli_says_when_the_peak_is_unknown(cli):
    probe, path = cli
    probe.source = "unknown"  # NVML listed others, never this process
    res = CliRunner().invoke(main, ["measure", "--json", "--", "python", str(path)])
    data = json.loads(res.stdout.strip())
    assert res.exit_code == 0 and data["status"] == "ok" and data["peak_source"] == "unknown"
    assert data["peak_bytes"] == 0 and data["peak_unknown"].startswith("NVML listed other")
    assert "the peak is unknown: NVML listed other" in res.stderr
    table = CliRunner().invoke(main, ["measure", "--", str(path)])
    assert "unknown" in table.stdout and "3,000.0 MiB" not in table.stdout


def test_cli_no_gpu_one_line(monkeypatch, write_script):
    path = write_script("print(1)")
    monkeypatch.setattr(cli_measure, "make_probe", lambda index: FakeProbe(reason="no driver"))
    res = CliRunner().invoke(main, ["measure", "--", "python", str(path)])
    assert res.exit_code == 2
    assert res.stderr.strip() == "peakmem measure: no CUDA GPU to measure on: no driver"


def test_cli_bad_command():
    res = CliRunner().invoke(main, ["measure", "--", "python", "/no/such/train.py"])
    assert res.exit_code == 2 and "script not found" in res.output


@pytest.mark.gpu
def test_real_probe_on_gpu(write_script):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from peakmem.measure.cuda_probe import CudaProbe

    path = write_script(
        "import torch\nx = torch.randn(1024, 1024, device='cuda', requires_grad=True)\n"
        "opt = torch.optim.Adam([x])\nfor _ in range(5):\n    (x @ x).sum().backward()\n"
        "    opt.step()\n"
    )
    probe = CudaProbe(0)
    result = measure_job(JobSpec(script=str(path)), probe, MeasureOptions(steps=2))
    assert result.status is MeasureStatus.OK
    assert result.peak_bytes >= result.peak_reserved_bytes >= result.peak_allocated_bytes > 4 * MiB
    assert result.context_bytes > 100 * MiB


def test_cli_env_prefix_and_wrappers(cli, monkeypatch):
    """`peakmem measure -- env NAME=VALUE nohup python train.py`: the launch parsing takes the
    prefix and the wrapper off; the variables are set in this process (the job's) first."""
    _, path = cli
    monkeypatch.delenv("PEAKMEM_MEASURE_PREFIX", raising=False)
    res = CliRunner().invoke(main, ["measure", "--json", "--steps", "2", "--", "env",
                                    "PEAKMEM_MEASURE_PREFIX=on", "nohup", "python", str(path)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip())["steps"] == 2
    assert os.environ.pop("PEAKMEM_MEASURE_PREFIX") == "on"
    ranked = CliRunner().invoke(main, ["measure", "--", "torchrun", "--nproc-per-node", "2",
                                       str(path)])
    assert ranked.exit_code == 2 and "runs one process" in ranked.output
