"""The capture's per-op path with fewer layers (issue 14, branch s6): the session's storage
bookkeeping inline (`track_storage`, `_storage_died`, `Trace.alloc_tagged`), the torch-function
mode's flat walk of positional arguments (`CaptureModes._any_marked`). Each gives what the
layered path gives; the whole estimates are held equal by `benchmarks/speed_regression.py`."""

from __future__ import annotations

import gc

import pytest
import torch

from peakmem.capture.capture_modes import CaptureModes
from peakmem.capture.host_deferred import HostDeferral
from peakmem.capture.session import CaptureSession
from peakmem.profiles import load_gpu, load_stack
from peakmem.trace.events import MAX_SIZE, EventKind, Trace
from peakmem.trace.vocab import Category, Phase


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def _events(trace: Trace) -> list[tuple]:
    return [(trace.kinds[i], trace.ids[i], trace.sizes[i], trace.streams[i],
             trace.tag_of(i)) for i in range(len(trace))]


def test_alloc_tagged_records_what_alloc_records():
    plain, tagged = Trace(), Trace()
    for trace in (plain, tagged):
        trace.alloc(8, 0)  # an earlier id: the next ones follow it
    tag_ids = [t.intern_fields("activation", "net.0", "forward", "relu") for t in (plain, tagged)]
    assert plain.alloc(512, 3, tag_id=tag_ids[0]) == tagged.alloc_tagged(512, 3, tag_ids[1]) == 1
    plain.free(1)
    tagged.free(1)
    assert _events(tagged) == _events(plain)
    assert tagged.kinds[1] is EventKind.ALLOC and tagged.kinds[2] is EventKind.FREE
    with pytest.raises(ValueError):
        tagged.alloc_tagged(-1, 0, tag_ids[1])
    with pytest.raises(OverflowError):
        tagged.alloc_tagged(MAX_SIZE + 1, 0, tag_ids[1])
    assert len(tagged) == 3  # nothing recorded for a refused size


def test_tracked_storages_are_allocated_and_freed_with_their_bytes():
    session = CaptureSession(gpu=load_gpu("a100-40gb"), stack=load_stack("2.4.1"))
    session.module_source = lambda: "net.1"
    first, second = _meta(16), _meta(8, 8, dtype=torch.float16)  # 64 and 128 bytes
    session.track(first, "relu")  # phase "other": its default category
    session.state.phase = Phase.FORWARD.value
    session.track(second, "conv", Category.ACTIVATION.value)
    session.track(second, "view")  # the same storage, not grown: nothing new
    assert (session.allocated_bytes, session.max_allocated_bytes) == (192, 192)
    del first
    gc.collect()
    assert (session.allocated_bytes, session.max_allocated_bytes) == (128, 192)
    third = _meta(4)
    session.track(third, "add")  # phase forward, no category: temporary
    trace = session.trace
    kinds = [EventKind(k) for k in trace.kinds]
    assert kinds == [EventKind.ALLOC, EventKind.ALLOC, EventKind.FREE, EventKind.ALLOC]
    assert trace.sizes == [64, 128, 0, 16]
    assert trace.ids == [0, 1, 0, 2]
    assert [(t.category, t.module, t.phase, t.op) for t in map(trace.tag_of, (0, 1, 3))] == [
        (Category.OTHER.value, "net.1", Phase.OTHER.value, "relu"),
        (Category.ACTIVATION.value, "net.1", Phase.FORWARD.value, "conv"),
        (Category.TEMPORARY.value, "net.1", Phase.FORWARD.value, "add"),
    ]
    assert trace.tag_of(2) is None
    assert sorted(record.nbytes for record in session.live.values()) == [16, 128]
    session.closed = True
    del second, third
    gc.collect()
    assert len(trace) == 4  # a closed session records nothing more
    assert session.allocated_bytes == 144


def _modes(kinds: dict[int, str], collated: set[int]) -> CaptureModes:
    deferral = HostDeferral.__new__(HostDeferral)
    deferral.kinds, deferral.collated = kinds, collated
    modes = CaptureModes.__new__(CaptureModes)
    modes.deferral, modes._kinds = deferral, kinds
    return modes


def _full_walk(modes: CaptureModes, args: tuple) -> bool:
    from peakmem.capture.arg_tensors import tensors_in

    tensors = tensors_in(args)
    return bool(tensors) and modes.deferral._any_marked(tensors)


def test_the_flat_walk_of_positional_arguments_answers_as_the_full_walk():
    device, host, batch, other = _meta(4), _meta(4), _meta(2, 4), _meta(3)
    param = torch.nn.Parameter(_meta(5))
    marked_param = torch.nn.Parameter(_meta(5))
    real, sparse = torch.ones(2), torch.zeros(2, 2).to_sparse().to("meta")
    kinds = {id(host.untyped_storage()): "host", id(marked_param.untyped_storage()): "meta"}
    modes = _modes(kinds, {id(batch.untyped_storage())})
    cases = [
        (device, other), (device, host), (host, device), (other, 2, batch), (device, 1.5, None),
        (param, device), (device, marked_param), (real, device), (sparse, device),
        (device, [other, host]), ([device], other), (device, (other, (batch,))),
        (device, {"a": host}), (torch.Size([2, 2]), device), (device, torch.float16, host),
        (), (1, 2), (device,), (host,),
    ]
    answers = [modes._any_marked(args, None) for args in cases]
    assert answers == [_full_walk(modes, args) for args in cases]
    assert answers[:8] == [False, True, True, True, False, False, True, False]
    assert answers[9:13] == [True, False, True, True]
