"""CUDA graphs, NVTX ranges and CUDA profiling as the job sees them during a capture.

CUDA graphs are not modelled: the code inside `torch.cuda.graph(...)` runs once, eagerly, where
it is written (its allocations are recorded like any other), `replay()` does nothing, and
`make_graphed_callables` returns the callables unchanged. A graph's private memory pool (its
blocks stay reserved for the graph's lifetime, apart from the rest of the cache) is not
modelled: the estimate says so in its notes. NVTX and CUDA profiler hooks are no-ops; the torch
profiler records host events only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.session import CaptureSession

GRAPH_NOTE = (
    "CUDA graphs were not modelled: graph-captured code ran eagerly once and replays were "
    "skipped; the graph's private memory pool (memory kept reserved for the graph) is not counted"
)


def _note(session: CaptureSession) -> None:
    if GRAPH_NOTE not in session.notes:
        session.notes.append(GRAPH_NOTE)


PROFILER_NOTE = "the torch profiler ran without its CUDA activity (no GPU): host events only"


def _profiler_note(session: CaptureSession) -> None:
    if PROFILER_NOTE not in session.notes:
        session.notes.append(PROFILER_NOTE)


class _NvtxStub:
    """`torch._C._nvtx` for a build without it: ranges nest, nothing is emitted."""

    def __init__(self) -> None:
        self.depth = 0
        self.next_id = 0

    def rangePushA(self, message: str) -> int:  # noqa: N802  (torch's spelling)
        self.depth += 1
        return self.depth - 1

    def rangePop(self) -> int:  # noqa: N802
        self.depth = max(self.depth - 1, 0)
        return self.depth

    def rangeStartA(self, message: str) -> int:  # noqa: N802
        self.next_id += 1
        return self.next_id

    def rangeEnd(self, range_id: int) -> None:  # noqa: N802
        return None

    def markA(self, message: str) -> None:  # noqa: N802
        return None

    def deviceRangeStart(self, message: str, stream: int = 0) -> int:  # noqa: N802
        return self.rangeStartA(message)

    def deviceRangeEnd(self, range_handle: Any, stream: int = 0) -> None:  # noqa: N802
        return None


class _NoOpProfilerContext:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.enabled = kwargs.get("enabled", args[0] if args else True)

    def __enter__(self) -> _NoOpProfilerContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    class FakeCUDAGraph:
        """`torch.cuda.CUDAGraph`: capture runs the work eagerly, replay does nothing."""

        def __init__(self, keep_graph: bool = False) -> None:
            self._capturing = False

        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
            _note(session)
            self._capturing = True

        def capture_end(self) -> None:
            self._capturing = False

        def instantiate(self) -> None:
            return None

        def replay(self) -> None:
            return None

        def reset(self) -> None:
            return None

        def pool(self) -> tuple[int, int]:
            return (0, id(self))

        def enable_debug_mode(self) -> None:
            return None

        def debug_dump(self, debug_path: str) -> None:
            return None

    class FakeGraph:
        """`torch.cuda.graph(g, pool=..., stream=...)`: the body runs eagerly, once."""

        default_capture_stream = None

        def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None, *args: Any, **kwargs: Any) -> None:
            self.cuda_graph = cuda_graph

        def __enter__(self) -> None:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # as the real context does before capturing
            self.cuda_graph.capture_begin()

        def __exit__(self, *exc: object) -> None:
            self.cuda_graph.capture_end()

    def make_graphed_callables(callables: Any, sample_args: Any, *args: Any, **kwargs: Any) -> Any:
        _note(session)
        return callables

    def graph_pool_handle() -> tuple[int, int]:
        return (0, 0)

    @contextmanager
    def cuda_profile() -> Iterator[None]:
        yield

    kineto_init = torch.profiler.profiler._KinetoProfile.__init__
    autograd_init = torch.autograd.profiler.profile.__init__

    def kineto_profile_init(self: Any, *args: Any, **kwargs: Any) -> None:
        """`torch.profiler.profile(activities=[..., CUDA])`: profiles the host side only."""
        kineto_init(self, *args, **kwargs)
        if torch.profiler.ProfilerActivity.CUDA in self.activities:
            self.activities.discard(torch.profiler.ProfilerActivity.CUDA)
            self.activity_filters.pop(torch.profiler.ProfilerActivity.CUDA, None)
            _profiler_note(session)
        if self.use_device == "cuda":
            self.use_device = None

    def autograd_profile_init(self: Any, *args: Any, **kwargs: Any) -> None:
        """`torch.autograd.profiler.profile(use_cuda=True | use_device="cuda")`: host only."""
        if kwargs.pop("use_cuda", False) or kwargs.get("use_device") == "cuda":
            kwargs["use_device"] = None
            _profiler_note(session)
        autograd_init(self, *args, **kwargs)
        if self.use_device == "cuda":
            self.use_device = None

    stub = _NvtxStub()
    found: dict[tuple[Any, str], Any] = {}
    for owner in (torch.cuda, torch.cuda.graphs):
        found.update(
            {
                (owner, "CUDAGraph"): FakeCUDAGraph,
                (owner, "graph"): FakeGraph,
                (owner, "make_graphed_callables"): make_graphed_callables,
                (owner, "graph_pool_handle"): graph_pool_handle,
            }
        )
    found[(torch.profiler.profiler._KinetoProfile, "__init__")] = kineto_profile_init
    found[(torch.autograd.profiler.profile, "__init__")] = autograd_profile_init
    found[(torch.cuda.nvtx, "_nvtx")] = stub
    found[(torch.autograd.profiler, "emit_nvtx")] = _NoOpProfilerContext
    found[(torch.cuda.profiler, "start")] = lambda: None
    found[(torch.cuda.profiler, "stop")] = lambda: None
    found[(torch.cuda.profiler, "profile")] = cuda_profile
    found[(torch.cuda.profiler, "init")] = lambda *args, **kwargs: None
    return found
