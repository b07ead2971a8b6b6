"""CUDA streams as the caching allocator sees them: each stream its own pool, `record_stream`
holds.

CUDACachingAllocator keys every free block by the stream it was allocated on: a block freed on
stream A is reused only by allocations on stream A (`BlockComparatorSize` orders by stream first,
`get_free_block` takes only a block of the asking stream). Communication libraries allocate on
their own streams (FSDP2's all-gather and reduce-scatter streams, FSDP1's unshard and
post-backward streams, DeepSpeed's reduction stream), so their buffers come from pools that the
compute stream cannot reuse.

Here each `torch.cuda.Stream()` gets an id (the default stream is 0); `with
torch.cuda.stream(s)`, `with s:`, `torch.cuda.set_stream(s)` make it current, and every
allocation the job makes is on the current stream (`CaptureSession.stream`, the trace's stream
column). `tensor.record_stream(s)` on another stream than the block's own records the use
(RECORD_STREAM); once the tensor is freed its block is held until the uses have completed. The
fake device runs nothing, so when they complete is assumed: at the next sync point, i.e. a device
or stream synchronize, an event synchronize or wait, a stream waiting on another, or the end of
an optimizer step (a training step's end synchronizes in practice: the loss is read, the next
batch's copy waits). Then the blocks go back to their pools at the next allocation
(FREE_COMPLETED: the allocator's `process_events`).

Ops run in program order (one host thread drives every stream): streams change where memory
comes from and when it may be reused, not the order of events.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from peakmem.capture.fake_cuda import FakeEvent, FakeStream
from peakmem.capture.session import DEVICE_STREAM, CaptureSession
from peakmem.cuda_rules.true_device import is_meta


class FakeStreams:
    """The streams of one capture: their ids and which one is current."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self._ids = itertools.count(DEVICE_STREAM + 1)
        streams = self

        class Stream(FakeStream):
            """`torch.cuda.Stream`: a new stream id; a context manager making it current."""

            def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
                stream_id = kwargs.pop("_stream_id", None)
                super().__init__(device, priority, **kwargs)
                self.stream_id = next(streams._ids) if stream_id is None else stream_id
                self.cuda_stream = self.stream_id
                self._outer: list[Any] = []

            def __enter__(self) -> Any:
                self._outer.append(streams.switch(self))
                return self

            def __exit__(self, *exc: object) -> None:
                streams.switch(self._outer.pop())

            def wait_stream(self, stream: Any) -> None:
                streams.sync()

            def wait_event(self, event: Any) -> None:
                streams.sync()

            def synchronize(self) -> None:
                streams.sync()

            def record_event(self, event: Any = None) -> Any:
                return event if event is not None else streams.Event()

            def __eq__(self, other: object) -> bool:
                return isinstance(other, FakeStream) and other.stream_id == self.stream_id

            def __hash__(self) -> int:
                return hash(self.stream_id)

            def __repr__(self) -> str:
                return f"<torch.cuda.Stream device=cuda:0 cuda_stream={self.stream_id:#x}>"

        class Event(FakeEvent):
            """`torch.cuda.Event`: waiting on it, or synchronizing it, is a sync point."""

            def wait(self, stream: Any = None) -> None:
                streams.sync()

            def synchronize(self) -> None:
                streams.sync()

        class StreamContext:
            """`torch.cuda.stream(s)` / `torch.cuda.StreamContext(s)`: `s` current inside."""

            def __init__(self, stream: Any = None) -> None:
                self.stream = stream
                self._outer: list[Any] = []

            def __enter__(self) -> Any:
                if self.stream is not None:
                    self._outer.append(streams.switch(self.stream))
                return self.stream

            def __exit__(self, *exc: object) -> None:
                if self._outer:
                    streams.switch(self._outer.pop())

        self.Stream = Stream
        self.Event = Event
        self.StreamContext = StreamContext
        self.default = Stream(_stream_id=DEVICE_STREAM)
        self.current: Any = self.default

    def switch(self, stream: Any) -> Any:
        """Make `stream` current; returns the stream that was."""
        previous = self.current
        if isinstance(stream, FakeStream):
            self.current = stream
            self.session.stream = stream.stream_id
        return previous

    def set_stream(self, stream: Any) -> None:
        self.switch(stream)

    def sync(self, *args: Any, **kwargs: Any) -> None:
        self.session.synchronize_streams()

    def current_stream(self, device: Any = None) -> Any:
        return self.current

    def default_stream(self, device: Any = None) -> Any:
        return self.default


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    streams = FakeStreams(session)
    original_record = torch.Tensor.record_stream

    def record_stream(self: torch.Tensor, stream: Any) -> None:
        if isinstance(stream, FakeStream):
            if is_meta(self):
                session.record_stream(self, stream.stream_id)
        elif isinstance(stream, torch.Stream):
            original_record(self, stream)

    cuda, accelerator = torch.cuda, torch.accelerator
    return {
        (cuda, "Stream"): streams.Stream,
        (cuda, "Event"): streams.Event,
        (cuda, "stream"): streams.StreamContext,
        (cuda, "StreamContext"): streams.StreamContext,
        (cuda, "current_stream"): streams.current_stream,
        (cuda, "default_stream"): streams.default_stream,
        (cuda, "set_stream"): streams.set_stream,
        (cuda, "synchronize"): streams.sync,
        (accelerator, "current_stream"): streams.current_stream,
        (accelerator, "set_stream"): streams.set_stream,
        (accelerator, "synchronize"): streams.sync,
        (torch.Tensor, "record_stream"): record_stream,
    }
