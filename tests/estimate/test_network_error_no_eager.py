"""Auto mode does not rerun eagerly a fake capture that failed for want of network access after
host reads of device values (estimate/api.py `eager_fallback_reason`, `NETWORK_ERRORS`): the
eager run has no network either. Round 23a: sentence-transformers' training_nq_prompts.py calls
`push_to_hub` (outside a `try`) after its NanoBEIR evaluator read device values; the eager rerun
took more than 8 minutes to fail the same way."""

import pytest

from peakmem.capture.result import CaptureResult
from peakmem.estimate.api import eager_fallback_reason


def _failed(error: BaseException, error_type: str | None = None, hint: str | None = None):
    capture = CaptureResult(trace=None, steps=1, stopped=False, forward_calls=3, seconds=1.0,
                            error=error, exit_code=1, host_reads=5, reason="raised",
                            error_type=error_type)
    capture.failure_hint = hint
    return capture


@pytest.mark.parametrize("error_type", ["OfflineModeIsEnabled", "ConnectionError", "URLError"])
def test_a_network_error_after_host_reads_is_not_rerun(error_type):
    capture = _failed(ConnectionError("Couldn't reach the Hub"), error_type=error_type)
    assert eager_fallback_reason(capture) is None


def test_an_error_after_the_unreachable_host_hint_is_not_rerun():
    hint = "it could not reach huggingface.co: there is no network access here"
    assert eager_fallback_reason(_failed(OSError("no model"), hint=hint)) is None


def test_other_errors_after_host_reads_still_are():
    reason = eager_fallback_reason(_failed(ValueError("loss is nan"), error_type="ValueError"))
    assert reason == ("the job failed (ValueError: loss is nan) after 5 host read(s) of device "
                      "values, which fake mode answers with zeros")
