"""A CaptureResult as the child process hands it to peakmem: JSON lines, never pickle.

The first line is a JSON object (format name, version, the child's pid and the result's fields);
the trace follows in :meth:`Trace.dump`'s format. The child runs untrusted code, which can write
anything there: :func:`decode` checks every field's type and bound, and the trace's columns,
and raises :class:`ResultFormatError` on anything else. Nothing read is executed.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

from peakmem.capture.spawned_children import valid_report
from peakmem.trace.events import NO_TAG, Tag, Trace

# Bound when peakmem's child starts (this module is imported before the job runs): the job may
# rebind `json.dumps` or `io.StringIO` once it is done, and its result is encoded after that.
_JSON_TEXT = json.JSONEncoder().encode  # what json.dumps(value) writes
_STRING_BUFFER = io.StringIO

FORMAT_NAME = "peakmem-capture-result"
FORMAT_VERSION = 1
MAX_TEXT = 1 << 20  # characters of one text field (a traceback)
MAX_ITEMS = 10_000  # entries of one list or mapping field
_INT_LIMIT = 1 << 63
_TOTAL_LIMIT = 1 << 96  # a total of up to 2^33 storages of the largest size


class ResultFormatError(ValueError):
    """The child's result is not a well-formed capture result."""


class JobError(Exception):
    """The job's exception as reported by the child: its class name and message (the object
    itself stayed in the child)."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(message)
        self.type_name = type_name


def _int(value: Any) -> bool:
    return type(value) is int and -_INT_LIMIT <= value < _INT_LIMIT


def _byte_total(value: Any) -> bool:
    """A sum of device storage sizes: each below 2^63 (a larger one is CUDA's overflow error),
    so a job holding several huge ones (an OOM answer) totals more than one int64 holds."""
    return type(value) is int and 0 <= value < _TOTAL_LIMIT


def _text(value: Any) -> bool:
    return isinstance(value, str) and len(value) <= MAX_TEXT


def _text_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_ITEMS and all(map(_text, value))


def _int_map(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= MAX_ITEMS
        and all(_text(k) and _int(v) for k, v in value.items())
    )


def _optional(check: Any) -> Any:
    return lambda value: value is None or check(value)


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value >= 0


# field name -> check of its JSON value
FIELDS: dict[str, Any] = {
    "steps": _int,
    "stopped": lambda v: isinstance(v, bool),
    "forward_calls": _int,
    "seconds": _number,
    "mode": lambda v: v in ("fake", "eager"),
    "mode_reason": _text,
    "error_text": _optional(_text),
    "exit_code": _int,
    "notes": _text_list,
    "libraries": _int_map,
    "fake_limit": _optional(_text),
    "host_reads": _int,
    "host_reads_before_forward": _int,
    "data_dependent": _int_map,
    "peak_device_bytes": _byte_total,
    "backward_passes": _int,
    "reason": _optional(_text),
    "job_exit_code": _optional(_int),
    "signal": _optional(_text),
    "error_type": _optional(_text),
    "error_message": _optional(_text),
    "failed": lambda v: isinstance(v, bool),
    "failure_hint": _optional(_text),
    "processes": lambda v: (isinstance(v, list) and len(v) <= MAX_ITEMS
                            and all(map(valid_report, v))),
    "failed_after_shortening": lambda v: isinstance(v, bool),
    "devices": lambda v: valid_device_reports(v),
}


DEVICE_FIELDS: dict[str, Any] = {
    "device": lambda v: type(v) is int and 0 <= v < (1 << 16),
    "peak_bytes": _byte_total,
    "context_bytes": _byte_total,
    "library_bytes": _byte_total,
    "peak_reserved_bytes": _byte_total,
    "peak_allocated_bytes": _byte_total,
    "breakdown": lambda v: (isinstance(v, dict) and len(v) <= 64 and all(
        isinstance(k, str) and len(k) <= 64 and _byte_total(n) for k, n in v.items())),
}
"""A device report's fields (`nn.DataParallel` over several GPUs, capture.data_parallel)."""


def valid_device_reports(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_ITEMS and all(
        isinstance(report, dict) and set(report) == set(DEVICE_FIELDS)
        and all(check(report[name]) for name, check in DEVICE_FIELDS.items())
        for report in value)


def encode(result: Any, pid: int) -> bytes:
    """The child's message for `result` (a CaptureResult)."""
    from peakmem.capture.result import first_line

    error = result.error
    fields = {
        name: getattr(result, name)
        for name in FIELDS
        if name not in ("error_message", "failed", "error_type")
    }
    fields["error_type"] = result.error_type or (type(error).__name__ if error else None)
    fields["error_message"] = first_line(error) if error is not None else None
    fields["failed"] = error is not None
    header = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "pid": pid, "result": fields}
    out = _STRING_BUFFER()
    out.write(_JSON_TEXT(header) + "\n")
    result.trace.dump(out)
    return out.getvalue().encode("utf-8")


def encode_internal(traceback_text: str, pid: int) -> bytes:
    """The child's message when peakmem itself failed in the child (a bug, not the job)."""
    header = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "pid": pid,
        "internal": traceback_text[:MAX_TEXT],
    }
    return (_JSON_TEXT(header) + "\n").encode("utf-8")


def decode(data: bytes) -> tuple[dict[str, Any], Trace | None, int]:
    """(fields, trace, pid) from a child's message; fields hold "internal" (a traceback) when
    peakmem failed in the child, and the trace is None then. ResultFormatError otherwise."""
    try:
        text = data.decode("utf-8")
        first, _, rest = text.partition("\n")
        header = json.loads(first)
    except (ValueError, RecursionError) as exc:
        raise ResultFormatError(f"the job's result is not JSON ({type(exc).__name__})") from None
    if (
        not isinstance(header, dict)
        or header.get("format") != FORMAT_NAME
        or header.get("version") != FORMAT_VERSION
        or not _int(header.get("pid"))
    ):
        raise ResultFormatError("the job's result lacks peakmem's header")
    pid = header["pid"]
    if "internal" in header:
        if not _text(header["internal"]):
            raise ResultFormatError("the job's result has a malformed internal error")
        return {"internal": header["internal"]}, None, pid
    fields = header.get("result")
    if not isinstance(fields, dict) or set(fields) != set(FIELDS):
        raise ResultFormatError("the job's result does not hold the capture's fields")
    for name, check in FIELDS.items():
        if not check(fields[name]):
            raise ResultFormatError(f"the job's result has a malformed field {name!r}")
    return fields, _decode_trace(rest), pid


def _decode_trace(text: str) -> Trace:
    try:
        trace = Trace.load(io.StringIO(text))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise ResultFormatError(f"the job's trace is malformed: {exc}") from None
    if not isinstance(trace.meta, dict):
        raise ResultFormatError("the job's trace has malformed metadata")
    for tag in trace.tags:
        if not all(value is None or _text(value) for value in _tag_fields(tag)):
            raise ResultFormatError("the job's trace has a malformed tag")
    for column in (trace.kinds, trace.ids, trace.streams, trace.tag_ids):
        if not all(map(_int, column)):
            raise ResultFormatError("the job's trace has a non-integer column")
    if not all(type(size) is int and 0 <= size < _INT_LIMIT for size in trace.sizes):
        raise ResultFormatError("the job's trace has a malformed allocation size")
    if any(tag_id != NO_TAG and tag_id < 0 for tag_id in trace.tag_ids):
        raise ResultFormatError("the job's trace has a malformed tag index")
    return trace


def _tag_fields(tag: Tag) -> tuple[Any, ...]:
    return (tag.category, tag.module, tag.phase, tag.op)


def capture_result(fields: dict[str, Any], trace: Trace) -> Any:
    """A CaptureResult from decoded fields."""
    from peakmem.capture.result import CaptureResult

    values = {
        name: fields[name]
        for name in FIELDS
        if name not in ("error_message", "failed")
    }
    error = None
    if fields["failed"]:
        error = JobError(fields["error_type"] or "JobError", fields["error_message"] or "")
    return CaptureResult(trace=trace, error=error, **values)
