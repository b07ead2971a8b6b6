"""CUDA graphs' private memory pools and torch.cuda.MemPool during a capture: the job's own
readings and the replayed trace, against figures worked out by hand from the caching
allocator's rules (allocator/private_pools.py).

Sizes: a 3 MiB uint8 tensor is a large request under 10 MiB, so a new segment for it is
kLargeBuffer = 20 MiB and later 3 MiB requests split it; a 12 MiB tensor (3 Mi float32) gets an
exact 12 MiB segment, never split, reused whole by the next 12 MiB request on its stream.
"""

import pytest
import torch

from peakmem.allocator import simulate
from peakmem.capture import capture_callable
from peakmem.capture.fake_graphs import GRAPH_NOTE
from peakmem.trace.events import EventKind

MiB = 2**20
U8 = torch.uint8


def _run(job, a100, stack24):
    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    return result


def _readings() -> tuple[int, int, int]:
    return (
        torch.cuda.memory_reserved(),
        torch.cuda.memory_allocated(),
        torch.cuda.max_memory_reserved(),
    )


@pytest.mark.parametrize("graphed", [True, False])
def test_whole_step_capture_reserves_the_graph_pool_apart(a100, stack24, graphed):
    seen = {}

    def job():
        static_in = torch.empty(3 * MiB, dtype=U8, device="cuda")  # default: 20 MiB segment
        graph = torch.cuda.CUDAGraph()

        def step(static_in):
            tmp = static_in + 1  # graphed: the pool's own 20 MiB segment; eager: the default one
            out = tmp * 2
            del tmp  # freed during the capture: back to the pool, for the pool only
            return out

        if graphed:
            with torch.cuda.graph(graph):
                out = step(static_in)
            for _ in range(3):
                graph.replay()  # allocates nothing
        else:
            out = step(static_in)
        seen["after_step"] = _readings()
        later = torch.empty(3 * MiB, dtype=U8, device="cuda")  # the default segment's free 17 MiB
        seen["later"] = _readings()
        del graph
        torch.cuda.empty_cache()  # pool released, but `out` still holds part of its segment
        seen["graph_gone"] = _readings()
        del out
        torch.cuda.empty_cache()  # now wholly free: cudaFreed
        seen["out_gone"] = _readings()
        del later, static_in

    result = _run(job, a100, stack24)
    if graphed:
        assert seen["after_step"] == (40 * MiB, 6 * MiB, 40 * MiB)
        assert seen["later"] == (40 * MiB, 9 * MiB, 40 * MiB)
        assert seen["graph_gone"] == (40 * MiB, 9 * MiB, 40 * MiB)
        assert seen["out_gone"] == (20 * MiB, 6 * MiB, 40 * MiB)
        assert GRAPH_NOTE in result.notes
    else:  # the same work eagerly fits the one default segment
        assert seen["after_step"] == (20 * MiB, 6 * MiB, 20 * MiB)
        assert seen["out_gone"] == (20 * MiB, 6 * MiB, 20 * MiB)
        assert GRAPH_NOTE not in result.notes
    replay = simulate(result.trace)
    assert replay.peak_reserved_bytes == (40 if graphed else 20) * MiB
    assert replay.peak_allocated_bytes == 9 * MiB


@pytest.mark.parametrize("shared", [True, False])
def test_a_shared_pool_handle_lets_the_second_graph_reuse_the_first_ones_frees(
    a100, stack24, shared
):
    seen = {}

    def job():
        x = torch.empty(3 * MiB, dtype=U8, device="cuda")  # default: 20 MiB
        handle = torch.cuda.graph_pool_handle()
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1, pool=handle):
            a = x + 1  # the pool's 20 MiB segment
            b = a * 2
            del a  # a capture-time free, kept for the pool
        with torch.cuda.graph(g2, pool=handle if shared else None):
            c = b + 1  # shared: a's block again; separate: a second pool, another 20 MiB
            d = c * 2
        seen["end"] = _readings()
        seen["pools"] = (g1.pool() == g2.pool(), g1.pool() == handle)
        del c, d, b, g1, g2

    result = _run(job, a100, stack24)
    reserved = 40 * MiB if shared else 60 * MiB
    assert seen["end"] == (reserved, 12 * MiB, reserved)
    assert seen["pools"] == (shared, True)
    assert simulate(result.trace).peak_reserved_bytes == reserved


class _Scale(torch.nn.Module):
    """y = x * w, elementwise: its backward allocates exactly grad*w and grad*x."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


def test_make_graphed_callables_warms_up_on_a_side_stream_and_keeps_static_tensors(a100, stack24):
    # Every tensor below is 12 MiB (an exact segment, reused only whole, on its own stream).
    # Default stream: weight, sample x                                       2 segments = 24
    # Warm-up (3 iterations, side stream W): an iteration's out, grad_out, grad_x, grad_w
    #   while the previous out, grad_x, grad_w live (grad_out dies after autograd.grad, the
    #   previous out when `outputs` is rebound): 6 segments on W             -> 96 (the peak)
    # torch.cuda.graph's empty_cache: W's 3 free segments go (the last iteration's out,
    #   grad_x, grad_w are still held by make_graphed_callables' locals)     -> 60
    # forward capture: static out in the shared private pool                 -> 72
    # static grad_out (empty_like, default stream, between the captures)     -> 84
    # the backward loop rebinds `outputs_grad` and `grad_inputs = None`: the warm-up's grad_x
    #   and grad_w die, and the second capture's empty_cache frees their W segments -> 60
    # backward capture: static grad_x, grad_w in the pool                    -> 84
    numel = 3 * MiB
    seen = {}

    def job():
        model = _Scale(numel).cuda()
        x = torch.randn(numel, device="cuda", requires_grad=True)
        graphed = torch.cuda.make_graphed_callables(model, (x,))
        seen["after"] = _readings()
        y = graphed(x)  # copies inputs into the static ones and replays: no allocation
        seen["called"] = (torch.cuda.memory_allocated(), y.shape, y.requires_grad)
        seen["module_graphed"] = (graphed is model, "forward" in vars(model))  # torch's way
        del y

    result = _run(job, a100, stack24)
    # allocated after: weight, x, static out, grad_out, grad_x, grad_w = 6 x 12 MiB
    assert seen["after"] == (84 * MiB, 72 * MiB, 96 * MiB)
    assert seen["called"] == (72 * MiB, torch.Size([numel]), True)
    assert seen["module_graphed"] == (True, True)
    trace = result.trace
    assert [kind for kind in trace.kinds if kind in (EventKind.POOL_BEGIN, EventKind.POOL_END)] == [
        EventKind.POOL_BEGIN, EventKind.POOL_END, EventKind.POOL_BEGIN, EventKind.POOL_END
    ]
    assert len({ident for kind, ident in zip(trace.kinds, trace.ids, strict=True)
                if kind == EventKind.POOL_BEGIN}) == 1  # one pool shared by both captures
    assert simulate(trace).peak_reserved_bytes == 96 * MiB


def test_mempool_and_use_mem_pool_route_allocations_to_a_private_pool(a100, stack24):
    seen = {}

    def job():
        pool = torch.cuda.MemPool()
        x = torch.empty(12 * MiB, dtype=U8, device="cuda")  # default: 12 MiB segment
        with torch.cuda.use_mem_pool(pool):
            seen["count_inside"] = pool.use_count()
            a = torch.empty(12 * MiB, dtype=U8, device="cuda")  # the pool's 12 MiB segment
        seen["count_after"] = pool.use_count()
        seen["pool_segments"] = [seg["total_size"] for seg in pool.snapshot()]
        del a  # back to the pool
        b = torch.empty(12 * MiB, dtype=U8, device="cuda")  # cannot take the pool's: new
        torch.cuda.empty_cache()  # the pool is in use: its free segment stays
        seen["cached"] = _readings()
        del pool  # ~MemPool: releasePool + emptyCache(its id)
        seen["pool_gone"] = _readings()
        del x, b

    result = _run(job, a100, stack24)
    assert seen["count_inside"] == 2 and seen["count_after"] == 1
    assert seen["pool_segments"] == [12 * MiB]
    assert seen["cached"] == (36 * MiB, 24 * MiB, 36 * MiB)
    assert seen["pool_gone"] == (24 * MiB, 24 * MiB, 36 * MiB)
    assert simulate(result.trace).peak_reserved_bytes == 36 * MiB


def test_graph_misuse_raises_in_the_job_as_on_the_gpu(a100, stack24):
    seen = {}

    def job():
        graph = torch.cuda.CUDAGraph()
        for name, call in (("replay", graph.replay), ("pool", graph.pool)):
            try:
                call()
            except RuntimeError as exc:
                seen[name] = str(exc)
        handle = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=handle):
            try:
                torch.cuda.CUDAGraph().capture_begin(pool=handle)
            except RuntimeError as exc:
                seen["twice"] = str(exc)
            seen["capturing"] = torch.cuda.is_current_stream_capturing()
        seen["capturing_after"] = torch.cuda.is_current_stream_capturing()

    result = _run(job, a100, stack24)
    assert "without a preceding successful capture" in seen["replay"]
    assert "without a preceding successful capture" in seen["pool"]
    assert "already recording" in seen["twice"]
    assert (seen["capturing"], seen["capturing_after"]) == (True, False)
    simulate(result.trace)  # the trace stays one the allocator replays


def test_a_graph_captured_every_step_is_not_repeated_over(monkeypatch):
    """Step repetition (capture.step_repeat) never repeats a window that begins, ends or
    releases a private pool: each step's graph has a pool of its own."""
    from torch import nn

    from tests.capture.test_step_repeat import assert_same

    def train():
        model = nn.Linear(64, 64).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(100):
            x = torch.randn(8, 64, device="cuda")
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = x * 2
            graph.replay()
            loss = model(y).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            del graph, y

    assert assert_same(monkeypatch, train, 8) == []


def test_whole_step_graph_is_reached_under_the_step_limit_and_its_replays_are_steps():
    """MLPerf-style: warm-up steps on a side stream, one captured train step, replays. Side
    stream steps do not end the job, so the capture happens under `--steps 3`; each replay of
    the captured optimizer step is a step, and the first replay past the limit stops the job."""
    from peakmem.estimate import estimate

    replays = []

    def train():
        model = torch.nn.Linear(256, 256).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        static_x = torch.randn(32, 256, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                model(static_x).square().mean().backward()
                optimizer.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = model(static_x).square().mean()
            static_loss.backward()
            optimizer.step()
        for _ in range(50):
            static_x.copy_(torch.randn(32, 256, device="cuda"))
            graph.replay()
            replays.append(1)

    result = estimate(train, steps=3, gpu="a100-40gb", torch_version="2.4.1")
    kinds = result.capture.trace.kinds
    assert EventKind.POOL_BEGIN in kinds and EventKind.POOL_END in kinds
    assert result.steps == 5  # 3 warm-up steps, the captured one, the first replay
    assert replays == []  # stopped inside the first replay
    assert GRAPH_NOTE in result.notes


def test_a_job_training_on_a_side_stream_throughout_is_stopped_after_a_grace():
    from peakmem.capture.phases import MAX_SIDE_STREAM_STEPS
    from peakmem.estimate import estimate

    def train():
        model = torch.nn.Linear(16, 16).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(1000):
                model(torch.randn(4, 16, device="cuda")).sum().backward()
                optimizer.step()
                optimizer.zero_grad()

    result = estimate(train, steps=3, gpu="a100-40gb", torch_version="2.4.1")
    assert result.steps == 3 + MAX_SIDE_STREAM_STEPS


def test_the_allocator_entry_points_route_to_a_pool_as_torch_cuda_memory_calls_them(
    a100, stack24
):
    seen = {}

    def job():
        handle = torch.cuda.graph_pool_handle()
        x = torch.empty(3 * MiB, dtype=U8, device="cuda")  # default: 20 MiB
        torch._C._cuda_beginAllocateToPool(0, handle)  # create, use count 1
        y = torch.empty(3 * MiB, dtype=U8, device="cuda")  # the pool's own 20 MiB
        torch._C._cuda_endAllocateToPool(0, handle)
        del y
        torch._C._cuda_releasePool(0, handle)  # use count 0: freeable
        seen["before_empty"] = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        seen["after_empty"] = torch.cuda.memory_reserved()
        del x

    _run(job, a100, stack24)
    assert seen == {"before_empty": 40 * MiB, "after_empty": 20 * MiB}
