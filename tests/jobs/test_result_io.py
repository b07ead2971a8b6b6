"""The child's result as JSON lines: a round trip, and hostile files refused."""

from __future__ import annotations

import json

import pytest

from peakmem.capture.result import CaptureResult
from peakmem.capture.result_io import JobError, ResultFormatError, capture_result, decode, encode
from peakmem.trace.events import Trace


def sample(error: BaseException | None = None) -> CaptureResult:
    trace = Trace(meta={"gpu": "l4"})
    a = trace.alloc(1024, category="parameter", module="fc")
    trace.mark("step 1")
    trace.free(a)
    return CaptureResult(
        trace=trace, steps=2, stopped=True, forward_calls=2, seconds=0.5, mode="fake",
        notes=["a note"], libraries={"cublas": 8}, data_dependent={"nonzero": 1},
        peak_device_bytes=1024, error=error, reason="raised" if error else None,
        error_text="Traceback...\nValueError: x" if error else None, exit_code=1 if error else 0,
    )


def test_round_trip():
    fields, trace, pid = decode(encode(sample(), pid=42))
    result = capture_result(fields, trace)
    assert pid == 42 and result.trace == sample().trace and result.trace.meta == {"gpu": "l4"}
    assert (result.steps, result.stopped, result.notes, result.libraries) == (
        2, True, ["a note"], {"cublas": 8})
    assert result.error is None


def test_an_error_comes_back_as_its_name_and_first_line():
    fields, trace, _ = decode(encode(sample(ValueError("bad value\nmore")), pid=1))
    result = capture_result(fields, trace)
    assert isinstance(result.error, JobError)
    assert (result.error.type_name, str(result.error)) == ("ValueError", "bad value")
    assert result.failed_after_shortening is False


def test_a_failure_after_the_shortening_comes_back_as_such():
    """What auto's unshortened rerun reads from a child's result (estimate/api.py)."""
    failed = sample(ValueError("past the schedule"))
    failed.failed_after_shortening = True
    fields, trace, _ = decode(encode(failed, pid=1))
    assert capture_result(fields, trace).failed_after_shortening is True
    fields["failed_after_shortening"] = "yes"  # a job's forged result: refused
    header = {"format": "peakmem-capture-result", "version": 1, "pid": 1, "result": fields}
    with pytest.raises(ResultFormatError, match="failed_after_shortening"):
        decode((json.dumps(header) + "\n").encode())


def _mutate(change) -> bytes:
    header, _, rest = encode(sample(), pid=1).decode().partition("\n")
    payload = json.loads(header)
    change(payload)
    return (json.dumps(payload) + "\n" + rest).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff\xfe",
        b"not json\n",
        b"[" * 100000 + b"\n",
        b'{"format": "peakmem-capture-result", "version": 1, "pid": 1}\n',
        _mutate(lambda p: p["result"].update(steps="many")),
        _mutate(lambda p: p["result"].update(steps=True)),
        _mutate(lambda p: p["result"].update(steps=10**30)),
        _mutate(lambda p: p["result"].update(notes=[1, 2])),
        _mutate(lambda p: p["result"].update(libraries={"x": "y"})),
        _mutate(lambda p: p["result"].update(mode="gpu")),
        _mutate(lambda p: p["result"].update(seconds=float("nan"))),
        _mutate(lambda p: p["result"].update(extra=1)),
        _mutate(lambda p: p.update(pid="1")),
        _mutate(lambda p: p.update(version=2)),
        encode(sample(), pid=1) + b'[0,"a",1,0,-1]\n',
        encode(sample(), pid=1) + b"[0,1,-5,0,-1]\n",
        encode(sample(), pid=1) + b"[0,1,5,0,99]\n",
        encode(sample(), pid=1) + b'[0,1,5,0,"x"]\n',
        encode(sample(), pid=1) + b"[[0],1,5,0,-1]\n",
        encode(sample(), pid=1) + b"[0,1,1.5,0,-1]\n",
        encode(sample(), pid=1) + b"{}\n",
    ],
)
def test_malformed_results_are_refused(data):
    with pytest.raises(ResultFormatError):
        decode(data)


def test_a_malformed_trace_header_is_refused():
    text = encode(sample(), pid=1).decode().splitlines()
    trace_header = json.loads(text[1])
    trace_header["tags"] = [[1, 2, 3, 4]]
    text[1] = json.dumps(trace_header)
    with pytest.raises(ResultFormatError):
        decode("\n".join(text).encode())


def test_outcomes_map_to_the_contract(tmp_path):
    from peakmem.capture.result_io import encode_internal
    from peakmem.capture.supervised import outcome_capture
    from peakmem.estimate.api import failure
    from peakmem.jobs.supervisor import ChildOutcome, OutcomeStatus

    names = iter(range(100))

    def outcome(status, data=None, **kw):
        path = tmp_path / f"r{next(names)}"
        if data is not None:
            path.write_bytes(data)
        return ChildOutcome(status=status, returncode=kw.pop("returncode", None), pid=7,
                            result_path=path, **kw)

    cases = [
        (outcome(OutcomeStatus.TIMEOUT), (124, "timeout", "timeout")),
        (outcome(OutcomeStatus.HOST_MEMORY, peak_rss_bytes=2**30),
         (1, "job_failed", "host_memory")),
        (outcome(OutcomeStatus.SIGNALED, signal="SIGSEGV"), (1, "job_failed", "signal")),
        (outcome(OutcomeStatus.EXITED, returncode=0), (1, "job_failed", "no_result")),
        (outcome(OutcomeStatus.EXITED, b"garbage", returncode=0), (1, "job_failed", "bad_result")),
        (outcome(OutcomeStatus.EXITED, encode(sample(), pid=8), returncode=0),
         (1, "job_failed", "bad_result")),  # not the child's own pid
        (outcome(OutcomeStatus.EXITED, encode_internal("Traceback: bug", pid=7), returncode=0),
         (70, "internal", "internal")),
    ]
    for child, (code, kind, reason) in cases:
        capture = outcome_capture(child, "fake", 5.0, 2**20)
        error = failure(capture)
        assert (error.exit_code, error.kind, error.reason) == (code, kind, reason), child
        assert "\n" not in error.message
    good = outcome_capture(outcome(OutcomeStatus.EXITED, encode(sample(), pid=7), returncode=0),
                           "fake", None, None)
    assert good.error is None and good.steps == 2
