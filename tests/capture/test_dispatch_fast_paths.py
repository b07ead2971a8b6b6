"""The capture's per-call fast paths (issue 14, branch s2) give the estimate the full paths give:
the whole estimate JSON, every trace event and tag and the utilization record, with each fast
path taken and with it forced off.

- `CudaAsMeta.__torch_function__` (capture/device_map.py): a call of a function with no branch
  of its own, naming no device and no pinned memory, runs as it is.
- `HostDeferral._any_marked` / `outputs_kind` (capture/host_deferred.py): plain tensors' true
  device read through `is_meta` instead of `device.type`.
- `HostDeferral.__torch_function__`: an attribute read (`grad`, `layout`, ...) of a plain
  tensor with an unmarked storage, with `CudaAsMeta` the only mode below, calls the getter.
- `AllocationRecorder.__torch_dispatch__` (capture/recorder.py): Dynamo is kept out of the
  recorder's frames by `torch._disable_dynamo` only where a Dynamo frame callback is set.
"""

from __future__ import annotations

import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from peakmem.capture import device_map, host_deferred, recorder
from peakmem.estimate import estimate
from tests.capture.capture_helpers import small_cnn_training_job as train
from tests.capture.capture_helpers import two_stacked_modes


def whole() -> dict:
    result = estimate(train, gpu="a100-40gb", steps="all")
    data = result.to_json()
    data.pop("seconds", None)
    trace = result.capture.trace
    data["trace"] = [list(trace.kinds), list(trace.ids), list(trace.sizes), list(trace.streams),
                     [None if t is None else t.to_json() for t in map(trace.tag_of, range(len(trace)))]]
    data["meta"] = trace.meta
    return json.loads(json.dumps(data, sort_keys=True, default=str))


class _Everything(frozenset):
    """A set that holds every function: the device map's fast path never applies."""

    def __contains__(self, item: object) -> bool:
        return True


class _Counted(frozenset):
    """`_OWN_BRANCHES` counting the calls that took the fast path's first test."""

    misses = 0

    def __contains__(self, item: object) -> bool:
        found = frozenset.__contains__(self, item)
        if not found:
            type(self).misses += 1
        return found


def test_the_device_maps_fast_path_gives_the_full_paths_estimate(monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(device_map, "_OWN_BRANCHES", _Everything())
        full = whole()
    _Counted.misses = 0
    with monkeypatch.context() as patch:
        patch.setattr(device_map, "_OWN_BRANCHES", _Counted(device_map._OWN_BRANCHES))
        fast = whole()
    assert _Counted.misses > 100
    assert fast == full
    assert full["trace"][0]  # a trace with events


def test_plain_tensors_read_as_meta_through_is_meta_give_the_same_estimate(monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(host_deferred, "_PLAIN_TENSORS", frozenset())  # `device.type` for all
        by_device = whole()
    assert whole() == by_device


def test_the_recorder_keeps_dynamo_out_only_under_a_frame_callback(monkeypatch):
    # not wrapped by TorchDispatchMode.__init_subclass__; the wrapped twin is Dynamo's disable
    assert not getattr(recorder.AllocationRecorder.__torch_dispatch__, "_torchdynamo_disable",
                       False)
    assert TorchDispatchMode._should_skip_dynamo()  # what the base class would have done
    assert recorder._dispatch_without_dynamo.__wrapped__ is (
        recorder.AllocationRecorder._guarded_dispatch)
    calls = [0]
    wrapped = recorder._dispatch_without_dynamo

    def counting(*args, **kwargs):
        calls[0] += 1
        return wrapped(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(recorder, "_dispatch_without_dynamo", counting)
        plain = whole()
        assert calls[0] == 0  # no Dynamo callback in an ordinary capture
        patch.setattr(recorder, "get_eval_frame_callback", lambda: object())
        guarded = whole()
    assert calls[0] > 100
    assert guarded == plain


def test_attribute_reads_read_directly_give_the_full_paths_estimate(monkeypatch):
    # the deferral's own fast path: taken where it is a mode of its own (backward's job view)
    two_stacked_modes(monkeypatch)
    taken = [0]
    original = host_deferred.HostDeferral._reads_attribute

    def counted(self, func, args):
        answer = original(self, func, args)
        taken[0] += answer
        return answer

    with monkeypatch.context() as patch:
        patch.setattr(host_deferred.HostDeferral, "_reads_attribute", lambda *a: False)
        full = whole()
    with monkeypatch.context() as patch:
        patch.setattr(host_deferred.HostDeferral, "_reads_attribute", counted)
        fast = whole()
    assert taken[0] > 100  # Adam's reads of every parameter's grad, layout, ...
    assert fast == full


def test_attribute_reads_handled_by_a_mode_are_not_read_directly(monkeypatch):
    from peakmem.capture.tensor_overrides import TENSOR_OVERRIDES

    deferral = host_deferred.HostDeferral.__new__(host_deferred.HostDeferral)
    deferral._handlers = {torch.Tensor.dtype.__get__: None}
    reads = deferral._unhandled_attribute_reads()
    assert torch.Tensor.grad.__get__ in reads and torch.Tensor.layout.__get__ in reads
    assert torch.Tensor.dtype.__get__ not in reads  # this mode's own handler
    monkeypatch.setitem(TENSOR_OVERRIDES, torch.Tensor.grad.__get__, lambda *a: None)
    assert torch.Tensor.grad.__get__ not in deferral._unhandled_attribute_reads()
