"""The k8 adversarial sweep's regressions (benchmarks/hostile_sweep_k8.py runs the whole sweep):
one test per class of hostile input that broke the contract before its fix. Each docstring says
what went wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

SRC = Path(__file__).resolve().parents[2] / "src"
TRAIN = """import torch
model = torch.nn.Linear(16, 16).cuda()
model(torch.randn(4, 16, device="cuda")).sum().backward()
"""


def run(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC), "PEAKMEM_WARM": "0"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def stderr_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


# -- device tensors whose byte size overflows int64 -------------------------------------------


def _capture(job):
    from peakmem.capture import capture_callable
    from peakmem.profiles import load_gpu, load_stack

    return capture_callable(job, gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"))


def test_a_device_tensor_over_int64_bytes_raises_cudas_overflow_error():
    """`torch.empty(2**62, device="cuda")` (2^64 bytes of float32) made a fake tensor whose
    storage was 0 bytes (2^61 floats: -2^63 bytes; 2^62 + 1: 4 bytes) and the estimate went on
    without it: exit 0, the peak of the rest of the job. CUDA's `empty` raises `Storage size
    calculation overflowed` for any storage over 2^63 - 1 bytes; a size that fits but no GPU
    holds (2^62 bytes) is recorded as it is: an OOM answer."""
    seen = []

    def job():
        for make in (lambda: torch.empty(2**62, device="cuda"),
                     lambda: torch.zeros(2**61, device="cuda"),
                     lambda: torch.empty(2**62 + 1, device="cuda"),
                     lambda: torch.ones(2**30, 2**30, 4, device="cuda"),
                     lambda: torch.empty_strided((2,), (2**62,), device="cuda")):
            try:
                make()
                seen.append("made")
            except RuntimeError as exc:
                seen.append(str(exc))
        keep = torch.empty(2**62, dtype=torch.uint8, device="cuda")
        seen.append(keep.untyped_storage().nbytes())

    result = _capture(job)
    assert result.error is None, result.error_text
    assert all(text.startswith("Storage size calculation overflowed with sizes=")
               for text in seen[:5]), seen
    assert seen[5] == 2**62
    assert max(result.trace.sizes) == 2**62 and min(result.trace.sizes) >= 0


def test_an_expanded_view_is_not_taken_for_an_overflow():
    """The check measures a tensor exactly only where its elements outnumber its storage's
    bytes: an expanded (stride 0) view of a small storage is such a tensor, and is no error."""
    from peakmem.capture.storage_size import check_storage_size, span_bytes

    base = torch.empty(4, device="meta")
    wide = base.expand(2**40, 4)
    assert span_bytes(wide) == 16
    check_storage_size(wide, 16)
    with pytest.raises(RuntimeError, match=r"sizes=\[4611686018427387904\] and strides=\[1\]"):
        check_storage_size(torch.empty_strided((2**62,), (1,), device="meta"), 0)


def test_a_job_holding_more_than_int64_bytes_is_an_oom_answer_not_a_bad_result():
    """Two 2^62-byte device tensors and the fake device's peak (2^63) no longer fit the result
    channel's int64 check: `peakmem could not read the job's result: ... malformed field
    'peak_device_bytes'` (exit 1) where the answer is a peak no GPU holds."""
    from peakmem.capture.result import CaptureResult
    from peakmem.capture.result_io import decode, encode
    from peakmem.trace.events import Trace

    trace = Trace()
    for _ in range(3):
        trace.alloc(2**62, 0)
    result = CaptureResult(trace=trace, steps=1, stopped=False, forward_calls=1, seconds=1.0,
                           peak_device_bytes=3 * 2**62)
    fields, decoded, _pid = decode(encode(result, 1))
    assert fields["peak_device_bytes"] == 3 * 2**62 and list(decoded.sizes) == [2**62] * 3
    bad = encode(CaptureResult(trace=Trace(), steps=1, stopped=False, forward_calls=1,
                               seconds=1.0, peak_device_bytes=-1), 1)
    with pytest.raises(ValueError, match="peak_device_bytes"):
        decode(bad)


# -- FIFOs given where a file is read or written ------------------------------------------------


def _with_timeout(call, seconds: float = 20):
    """call() in a thread; fails the test (instead of hanging it) past `seconds`."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert box, f"still blocked after {seconds} s"
    return box[0]


@pytest.mark.parametrize("args", [["{fifo}"], ["--jobs", "{fifo}"]])
def test_pack_refuses_a_fifo_without_blocking(args, tmp_path):
    """`pack FIFO` / `pack --jobs FIFO` opened the FIFO for reading with a blocking open: it
    hung until some process wrote to it (the other readers refuse one at once)."""
    from peakmem.cli.main import main

    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)
    argv = ["pack", "--json", "--gpus", "1xh100-80gb", *[a.format(fifo=fifo) for a in args]]
    result = _with_timeout(lambda: CliRunner().invoke(main, argv))
    assert result.exit_code == 2, result.output
    assert f"{fifo}: is a FIFO, not a regular file" in json.loads(result.stdout)["error"]["message"]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_batch_names_what_its_jobs_file_is_instead_of_calling_it_missing(kind, tmp_path):
    """`batch FIFO` and `batch /dev/null` said `no such jobs file`: the file is there, it is
    not a regular file. And a refused jobs file printed a blank line (rich's progress bar,
    stopped without having started) before its one error line."""
    from peakmem.cli.main import main

    path = tmp_path / "jobs.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path = Path("/dev/null")
    result = CliRunner().invoke(main, ["batch", "--in-process", "--json", str(path)])
    assert result.exit_code == 2
    what = "a FIFO" if kind == "fifo" else "a device"
    assert f"the jobs file {path}: is {what}, not a regular file" in result.stderr
    (tmp_path / "bad.jsonl").write_text("x\n")
    proc = run("-m", "peakmem", "batch", "--in-process", "bad.jsonl", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("peakmem: error: bad.jsonl line 1")


@pytest.mark.parametrize("flag, name", [("--snapshot", "s.pickle"), ("--timeline", "t.html")])
def test_an_output_fifo_without_a_reader_is_refused_before_the_job(flag, name, tmp_path):
    """`estimate --snapshot FIFO` ran the whole job, then blocked for ever in `open` writing
    the pickle (--timeline t.html as well): no process read the FIFO."""
    (tmp_path / "train.py").write_text(TRAIN)
    os.mkfifo(tmp_path / name)
    proc = run("-m", "peakmem", "estimate", "--json", flag, name, "train.py", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["message"] == f"cannot write {flag} {tmp_path / name}: a FIFO that no process reads"


def test_an_output_fifo_with_a_reader_is_probed_without_ending_its_data(tmp_path):
    """The probe opens the FIFO and keeps it open: a reader does not see the end of its data
    at the probe, only when peakmem exits after its real write."""
    from peakmem.cli import output_paths

    fifo = tmp_path / "s.pickle"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    for _ in range(200):  # the reader's open is in flight: the probe must see it
        if not output_paths.fifo_without_reader(str(fifo)):
            break
        threading.Event().wait(0.01)
    held = output_paths._HELD_FIFOS.pop()
    with open(fifo, "wb") as handle:
        handle.write(b"data")
    assert reader.is_alive()  # the probe's end is still open: the reader waits for more
    os.close(held)
    reader.join(10)
    assert got == [b"data"]
    assert output_paths.fifo_without_reader(str(tmp_path / "missing")) is False


# -- a batch results file that is one of the jobs' inputs ---------------------------------------


@pytest.mark.parametrize("output, says", [
    ("train.py", "is a Python source file"),
    ("data.txt", "is 'data.txt', a file the command of job 'a' names"),
])
def test_batch_refuses_results_appended_to_a_jobs_input(output, says, tmp_path):
    """`batch jobs.jsonl -o train.py` appended the JSON results to the jobs' own script (and
    `-o data.txt` to a file a job reads); `estimate --job-log train.py` was refused already."""
    from peakmem.cli.main import main

    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "data.txt").write_text("data\n")
    job = {"id": "a", "command": ["python", "train.py", "--data", "data.txt"], "cwd": "."}
    (tmp_path / "jobs.jsonl").write_text(json.dumps(job) + "\n")
    result = CliRunner().invoke(main, ["batch", "--in-process", "--json",
                                       "--estimator", "peakmem.service.estimators:fake_estimator",
                                       str(tmp_path / "jobs.jsonl"), "-o", str(tmp_path / output)])
    assert result.exit_code == 2, result.output
    assert says in json.loads(result.stdout)["error"]["message"]
    assert (tmp_path / "train.py").read_text() == TRAIN
    assert (tmp_path / "data.txt").read_text() == "data\n"


# -- the service: bodies that are slow, compressed or have a million keys -----------------------


@pytest.mark.parametrize("where", ["top", "options"])
def test_a_body_of_a_million_unknown_keys_is_one_error(where):
    """pydantic's `extra="forbid"` built one error per unknown key: a 10^6-key body took 50 s
    of the service's time to refuse (the answer kept 20 of the errors). Now one error names a
    few of them and how many more."""
    from pydantic import ValidationError

    from peakmem.service.models import EstimateRequest

    keys = {f"k{i}": 1 for i in range(100_000)}
    body = ({"command": ["python", "t.py"], **keys} if where == "top"
            else {"command": ["python", "t.py"], "options": keys})
    with pytest.raises(ValidationError) as caught:
        EstimateRequest.model_validate(body)
    errors = caught.value.errors()
    assert len(errors) == 1, len(errors)
    assert "unknown field(s) 'k0', 'k1', 'k2', 'k3', 'k4' and 99995 more" in errors[0]["msg"]
    ok = EstimateRequest.model_validate({"command": ["python", "t.py"], "options": {"steps": 2}})
    assert ok.options.steps == 2


def _app_client():
    from fastapi.testclient import TestClient

    from peakmem.service.app import ServiceConfig, create_app
    from peakmem.service.estimators import fake_estimator

    app = create_app(ServiceConfig(sandbox="off", workers=1), estimator=fake_estimator)
    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br, gzip"])
def test_a_compressed_body_is_refused_as_unsupported(encoding):
    """A gzip or deflate body was parsed as JSON as it came: 400 `malformed request: There was
    an error parsing the body`, which does not say why. Nothing inflates a body (no bomb)."""
    import gzip

    body = gzip.compress(json.dumps({"command": ["python", "t.py"]}).encode())
    with _app_client() as client:
        answer = client.post("/v1/estimates", content=body,
                             headers={"content-type": "application/json",
                                      "content-encoding": encoding})
    assert answer.status_code == 415
    assert answer.json() == {"detail": f"Content-Encoding {encoding} is not supported: send the "
                                       "body uncompressed"}


def test_a_body_that_stalls_is_answered_408_in_bounded_time():
    """A client that sent its headers and part of its body, then nothing (slowloris), held
    its connection and the request's task for ever: no read of the body had a deadline."""
    import asyncio
    import time

    from peakmem.service.body_limit import BodyDeadline

    async def app(scope, receive, send):  # reads the whole body, as a route does
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def stalled():
        if not sent_part:
            sent_part.append(1)
            return {"type": "http.request", "body": b'{"a"', "more_body": True}
        await asyncio.sleep(3600)

    async def whole():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    def answer(receive) -> tuple[int, float]:
        out: list[dict] = []

        async def send(message):
            out.append(message)

        start = time.monotonic()
        asyncio.run(BodyDeadline(app, seconds=0.3)({"type": "http", "method": "POST",
                                                     "path": "/", "headers": []}, receive, send))
        return out[0]["status"], time.monotonic() - start

    sent_part: list[int] = []
    status, seconds = answer(stalled)
    assert status == 408 and seconds < 5
    assert answer(whole)[0] == 200


# -- fit over a huge range ----------------------------------------------------------------------


@pytest.mark.parametrize("low, high", [(1, 2**63 - 1), (1, 10**12), (1000, 2**62)])
def test_fit_over_a_huge_range_takes_tens_of_estimates_not_a_hundred(low, high):
    """`fit --arg b=1..9223372036854775807` over `torch.empty(b, dtype=torch.uint8)`: after
    three secant misses on the allocator's 2 MiB steps the search halved [8e10, 2^63] one
    estimate pair at a time: 129 estimates (over 10 min), 82 for 1..10^12. The bisection now
    takes the geometric mean of a bracket spanning more than a factor of four and probes no
    neighbour of its own midpoints: 31."""
    import math

    from peakmem.estimate.fit_search import Probe, find_largest

    step = 2 * 2**20
    capacity = 85017493504

    def peak(value: int) -> int:  # context, the allocator's 2 MiB rounding, a 1.5 % margin
        return int((640 * 2**20 + math.ceil(value / step) * step) * 1.015)

    calls: list[int] = []

    def measure(value: int) -> Probe:
        calls.append(value)
        return Probe(value, peak(value), peak(value) <= capacity)

    answer = find_largest(measure, low, high, capacity, "gpu")
    lo, hi = low, high  # the answer by a plain bisection over the same function
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= capacity else (lo, mid)
    assert answer.value == lo and peak(lo + 1) > capacity
    assert len(calls) == len(set(calls)) and len(calls) <= 40, len(calls)
