"""CUDA graphs, private memory pools, NVTX ranges and CUDA profiling as the job sees them
during a capture.

CUDA graphs: the code inside `torch.cuda.graph(g)` runs once, eagerly, where it is written, and
its allocations are recorded in the graph's private memory pool (POOL_BEGIN ... POOL_END in the
trace; capture.graph_pools, allocator.private_pools): they come from segments of their own, a
capture-time free goes back to that pool only, and the pool's segments stay reserved until the
graph is reset or destroyed (`releasePool`) and the cache is emptied. `pool=` (a
`graph_pool_handle()`, another graph's `pool()`, a MemPool's `id`) shares one pool between
graphs. `replay()` re-runs nothing and allocates nothing, as on the GPU. As `torch.cuda.graph`
does, the capture synchronizes, empties the cache and runs on a side stream of its own.
A host read of a device tensor between `capture_begin` and `capture_end` (`.item()`, `.cpu()`,
printing) raises CUDA's "operation not permitted when stream is capturing" (capture.device_map).
`make_graphed_callables` is torch's own, run over these fakes: its warm-up iterations on a side
stream, then every forward and backward captured into one shared pool, whose static inputs,
outputs and gradients stay allocated for the callables' lifetime.
`torch.cuda.MemPool` and `torch.cuda.use_mem_pool` route allocations to a private pool the same
way (a MemPool's destructor releases it and empties its cache).
Not modelled: what a replay computes (values), MemPool's `use_on_oom` and `no_split` options
(noted), and Inductor's CUDA graph trees (torch.compile's "reduce-overhead": compiled_code
notes it). NVTX and CUDA profiler hooks are no-ops; the torch profiler records host events
only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.graph_pools import GraphPools, as_pool_handle
from peakmem.capture.session import CaptureSession
from peakmem.capture.unsupported import Unsupported

GRAPH_NOTE = (
    "CUDA graphs were modelled by their memory: graph-captured code ran once, eagerly, its "
    "allocations in the graph's private memory pool (reserved apart from the rest of the cache "
    "until the graph is reset or destroyed and the cache emptied); replays re-ran nothing"
)
MEMPOOL_OPTIONS_NOTE = (
    "torch.cuda.MemPool's use_on_oom / no_split options were not modelled: the pool was "
    "simulated as a plain private pool"
)


def _note(session: CaptureSession, note: str = GRAPH_NOTE) -> None:
    if note not in session.notes:
        session.notes.append(note)


def _real_make_graphed_callables() -> Any:
    """torch's own make_graphed_callables (not a fake left in place by an outer capture)."""
    found = torch.cuda.graphs.make_graphed_callables
    return getattr(found, "__wrapped__", found) if getattr(found, "_peakmem_fake", False) else found


_MAKE_GRAPHED_CALLABLES = _real_make_graphed_callables()


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
    pools = GraphPools(session)

    class FakeCUDAGraph:
        """`torch.cuda.CUDAGraph`: the capture records into the graph's private pool; replay
        does nothing; reset (or the graph's end) releases the pool."""

        def __init__(self, keep_graph: bool = False) -> None:
            self._handle: tuple[int, int] | None = None
            self._capturing = False
            self._captured = False
            self._steps_before: dict[Any, int] = {}
            self._step_keys: list[Any] = []

        def capture_begin(
            self, pool: Any = None, capture_error_mode: str = "global", **kwargs: Any
        ) -> None:
            _note(session)
            if pool is not None and any(as_pool_handle(pool)):
                handle = as_pool_handle(pool)
            else:
                handle = pools.new_handle(user_created=False)
            pools.begin(handle)
            self._handle = handle
            self._capturing = True
            session.graph_captures += 1
            tracker = session.phase_tracker
            self._steps_before = tracker.step_counts() if tracker is not None else {}

        def capture_end(self) -> None:
            if self._handle is None or not self._capturing:
                raise RuntimeError("Called CUDAGraph::capture_end without a capture_begin")
            pools.end(self._handle)
            self._capturing = False
            session.graph_captures = max(session.graph_captures - 1, 0)
            self._captured = True
            tracker = session.phase_tracker
            after = tracker.step_counts() if tracker is not None else {}
            self._step_keys = [  # optimizers that stepped inside the capture
                key for key, count in after.items() if count > self._steps_before.get(key, 0)
            ]

        def instantiate(self) -> None:
            return None

        def replay(self) -> None:
            if not self._captured:
                raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
            tracker = session.phase_tracker
            if self._step_keys and tracker is not None:
                tracker.replay_steps(self._step_keys)  # a captured optimizer step, replayed

        def reset(self) -> None:
            if self._captured and self._handle is not None:
                self._captured = False
                pools.release(self._handle)

        def __del__(self) -> None:
            with contextlib.suppress(Exception):  # the capture may be over: nothing to record
                self.reset()

        def pool(self) -> tuple[int, int]:
            if self._handle is None:
                raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
            return self._handle

        def raw_cuda_graph(self) -> int:
            return 0  # no cudaGraph_t exists: a null handle

        def raw_cuda_graph_exec(self) -> int:
            return 0

        def enable_debug_mode(self) -> None:
            return None

        def debug_dump(self, debug_path: str) -> None:
            return None

    class FakeGraph:
        """`torch.cuda.graph(g, pool=..., stream=...)`: synchronize, empty the cache, then run
        the body once on the capture stream, recording into the graph's pool."""

        default_capture_stream = None

        def __init__(
            self, cuda_graph: Any, pool: Any = None, stream: Any = None, *args: Any, **kwargs: Any
        ) -> None:
            if stream is None and type(self).default_capture_stream is None:
                type(self).default_capture_stream = torch.cuda.Stream()
            self.pool = () if pool is None else (pool,)
            self.capture_stream = stream if stream is not None else type(self).default_capture_stream
            self.stream_ctx = torch.cuda.stream(self.capture_stream)
            self.cuda_graph = cuda_graph

        def __enter__(self) -> None:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # as the real context does before capturing
            self.stream_ctx.__enter__()
            self.cuda_graph.capture_begin(*self.pool)

        def __exit__(self, *exc: object) -> None:
            self.cuda_graph.capture_end()
            self.stream_ctx.__exit__(*exc)

    def make_graphed_callables(callables: Any, sample_args: Any, *args: Any, **kwargs: Any) -> Any:
        """torch's own, over the fake graphs: warm-up, captures into one shared pool."""
        _note(session)
        return _MAKE_GRAPHED_CALLABLES(callables, sample_args, *args, **kwargs)

    make_graphed_callables._peakmem_fake = True  # type: ignore[attr-defined]
    make_graphed_callables.__wrapped__ = _MAKE_GRAPHED_CALLABLES  # type: ignore[attr-defined]

    def graph_pool_handle() -> tuple[int, int]:
        return pools.new_handle(user_created=True)

    class FakeMemPool:
        """`torch.cuda.MemPool`: a private pool of the caching allocator (use count 1)."""

        def __init__(
            self,
            allocator: Any = None,
            use_on_oom: bool = False,
            no_split: bool = False,
            *args: Any,
            **kwargs: Any,
        ) -> None:
            if allocator is not None:
                raise Unsupported("torch.cuda.MemPool with a custom allocator")
            if use_on_oom or no_split:
                _note(session, MEMPOOL_OPTIONS_NOTE)
            self._id = pools.new_handle(user_created=True)
            pools.create(self._id)
            self._alive = True

        @property
        def id(self) -> tuple[int, int]:
            return self._id

        @property
        def allocator(self) -> None:
            return None

        def use_count(self) -> int:
            return pools.use_count(self._id)

        def snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
            memory = session.memory
            if memory is None:
                return []
            number = pools.pool_id(self._id)  # the simulation names a pool (0, its number)
            with session._lock:
                return [seg for seg in memory.segments() if seg["segment_pool_id"] == (0, number)]

        def __del__(self) -> None:
            if not getattr(self, "_alive", False):
                return
            self._alive = False
            with contextlib.suppress(Exception):  # ~MemPool: releasePool, emptyCache(id)
                pools.release(self._id)
                pools.empty(self._id)

    @contextmanager
    def use_mem_pool(pool: Any, device: Any = None) -> Iterator[None]:
        """`torch.cuda.use_mem_pool`: allocations go to `pool` inside the block."""
        pools.begin(pool.id)
        try:
            yield
        finally:
            pools.end(pool.id)
            pools.release(pool.id)

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
                (owner, "is_current_stream_capturing"): pools.capturing,
            }
        )
    for owner in (torch.cuda, torch.cuda.memory):
        found[(owner, "MemPool")] = FakeMemPool
        found[(owner, "use_mem_pool")] = use_mem_pool
    # the allocator's own entry points, as torch.cuda.memory and libraries call them
    found[(torch._C, "_cuda_beginAllocateToPool")] = lambda device, pool: pools.begin(pool)
    found[(torch._C, "_cuda_beginAllocateCurrentThreadToPool")] = (
        lambda device, pool: pools.begin(pool)
    )
    found[(torch._C, "_cuda_endAllocateToPool")] = lambda device, pool: pools.end(pool)
    found[(torch._C, "_cuda_releasePool")] = lambda device, pool: pools.release(pool)
    found[(torch.profiler.profiler._KinetoProfile, "__init__")] = kineto_profile_init
    found[(torch.autograd.profiler.profile, "__init__")] = autograd_profile_init
    found[(torch.cuda.nvtx, "_nvtx")] = stub
    found[(torch.autograd.profiler, "emit_nvtx")] = _NoOpProfilerContext
    found[(torch.cuda.profiler, "start")] = lambda: None
    found[(torch.cuda.profiler, "stop")] = lambda: None
    found[(torch.cuda.profiler, "profile")] = cuda_profile
    found[(torch.cuda.profiler, "init")] = lambda *args, **kwargs: None
    return found
