"""Streams in the capture (capture/fake_streams.py), on hand-worked cases from
CUDACachingAllocator's rules: a freed block is reused only on the stream it was allocated on;
`record_stream` on another stream holds a freed block until the next sync point.

Sizes are 20 MiB: large-pool requests above 10 MiB get a segment of exactly their size (rounded
to 2 MiB), so `memory_reserved()` counts the segments one by one."""

import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.trace.events import EventKind

MiB = 2**20
SIZE = 20 * MiB
NUMEL = SIZE // 4


def run(job, a100, stack24, steps="all"):
    seen = {}
    result = capture_callable(job, seen, gpu=a100, stack=stack24, steps=steps)
    assert result.error is None, result.error_text
    return seen, result


def test_a_block_freed_on_one_stream_is_not_reused_by_another(a100, stack24):
    def job(seen):
        side = torch.cuda.Stream()
        first = torch.empty(NUMEL, device="cuda")
        del first  # cached in stream 0's pool
        with torch.cuda.stream(side):
            seen["current"] = torch.cuda.current_stream() == side
            on_side = torch.empty(NUMEL, device="cuda")  # a new segment for the side stream
        seen["after side"] = torch.cuda.memory_reserved()
        del on_side
        again = torch.empty(NUMEL, device="cuda")  # stream 0 reuses its own cached block
        seen["after default"] = torch.cuda.memory_reserved()
        del again
        with side:  # `with stream:` makes it current too, and its cached block is reused
            torch.empty(NUMEL, device="cuda")
        seen["after side again"] = torch.cuda.memory_reserved()
        seen["restored"] = torch.cuda.current_stream() == torch.cuda.default_stream()

    seen, result = run(job, a100, stack24)
    assert seen["current"] and seen["restored"]
    assert seen["after side"] == 2 * SIZE
    assert seen["after default"] == 2 * SIZE
    assert seen["after side again"] == 2 * SIZE
    streams = [stream for kind, _, size, stream, _ in result.trace.events()
               if kind == EventKind.ALLOC and size == SIZE]
    assert streams[0] == 0 and streams[1] != 0 and streams[2] == 0 and streams[3] == streams[1]


def test_the_same_job_on_one_stream_reuses_its_block(a100, stack24):
    def job(seen):
        first = torch.empty(NUMEL, device="cuda")
        del first
        torch.empty(NUMEL, device="cuda")
        seen["reserved"] = torch.cuda.memory_reserved()

    seen, _ = run(job, a100, stack24)
    assert seen["reserved"] == SIZE


def recorded_then_reallocated(sync):
    def job(seen):
        side = torch.cuda.Stream()
        held = torch.empty(NUMEL, device="cuda")
        held.record_stream(side)  # used by the side stream: freeing it waits for that use
        del held
        sync(side)
        kept = torch.empty(NUMEL, device="cuda")
        seen["reserved"] = torch.cuda.memory_reserved()
        seen["allocated"] = torch.cuda.memory_allocated()
        del kept
    return job


def no_sync(side):
    pass


def device_synchronize(side):
    torch.cuda.synchronize()


def stream_synchronize(side):
    side.synchronize()


def event_wait(side):
    event = torch.cuda.Event()
    event.record(side)
    torch.cuda.current_stream().wait_event(event)


def stream_wait(side):
    torch.cuda.current_stream().wait_stream(side)


def recorded_event_synchronize(side):
    side.record_event().synchronize()


def test_record_stream_holds_the_freed_block_until_a_sync_point(a100, stack24):
    seen, result = run(recorded_then_reallocated(no_sync), a100, stack24)
    assert seen["reserved"] == 2 * SIZE  # the held block cannot be handed out again
    assert seen["allocated"] == SIZE
    assert EventKind.RECORD_STREAM in result.trace.kinds


@pytest.mark.parametrize("sync", [device_synchronize, stream_synchronize, event_wait, stream_wait,
                                  recorded_event_synchronize])
def test_a_sync_point_hands_the_held_block_back(a100, stack24, sync):
    seen, result = run(recorded_then_reallocated(sync), a100, stack24)
    assert seen["reserved"] == SIZE
    assert EventKind.FREE_COMPLETED in result.trace.kinds


def test_record_stream_on_its_own_stream_holds_nothing(a100, stack24):
    def job(seen):
        held = torch.empty(NUMEL, device="cuda")
        held.record_stream(torch.cuda.current_stream())
        del held
        torch.empty(NUMEL, device="cuda")
        seen["reserved"] = torch.cuda.memory_reserved()

    seen, result = run(job, a100, stack24)
    assert seen["reserved"] == SIZE
    assert EventKind.RECORD_STREAM not in result.trace.kinds


def test_the_end_of_an_optimizer_step_hands_held_blocks_back(a100, stack24):
    def job(seen):
        side = torch.cuda.Stream()
        weight = torch.nn.Parameter(torch.zeros(4, device="cuda"))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        for step in range(2):
            held = torch.empty(NUMEL, device="cuda")
            held.record_stream(side)
            del held
            (weight * 2).sum().backward()
            optimizer.step()
            seen[f"reserved after step {step}"] = torch.cuda.memory_reserved()

    seen, _ = run(job, a100, stack24)
    # step 0's block was handed back at the end of step 0, so step 1 reuses it
    assert seen["reserved after step 1"] == seen["reserved after step 0"]
    assert seen["reserved after step 0"] >= SIZE
