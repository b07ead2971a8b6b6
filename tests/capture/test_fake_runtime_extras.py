"""The rest of the fake CUDA runtime: RNG, graphs, NVTX and profilers, spawn, threads, the
default device, sparse tensors, AMP, and the smaller runtime queries."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from peakmem.capture import Unsupported, capture_callable
from peakmem.estimate import api
from tests.capture.capture_helpers import allocations

MIB = 2**20


def _run(job, a100, stack24, **kwargs):
    result = capture_callable(job, gpu=a100, stack=stack24, **kwargs)
    assert result.error is None, result.error_text
    return result


# -- RNG ---------------------------------------------------------------------------------------
def test_cuda_rng_state_and_seeds_behave_like_one_device_generator(a100, stack24):
    seen = {}

    def job():
        torch.manual_seed(3)  # seeds CUDA too (torch.cuda.manual_seed_all)
        seen["after_torch_seed"] = torch.cuda.initial_seed()
        torch.cuda.manual_seed(5)
        seen["initial"] = torch.cuda.initial_seed()
        torch.cuda.random.manual_seed_all(6)
        seen["random_module"] = torch.cuda.random.initial_seed()
        state = torch.cuda.get_rng_state()
        seen["state"] = (state.dtype, state.device.type)
        torch.cuda.seed()
        torch.cuda.seed_all()
        torch.cuda.set_rng_state(state)
        seen["restored"] = torch.equal(torch.cuda.get_rng_state(), state)
        torch.cuda.set_rng_state_all(torch.cuda.get_rng_state_all())
        seen["generators"] = len(torch.cuda.default_generators)
        with torch.random.fork_rng(devices=[0], device_type="cuda"):
            torch.cuda.manual_seed(99)
        seen["forked"] = torch.cuda.initial_seed()
        generator = torch.Generator(device="cuda")
        generator.manual_seed(11)
        seen["generator"] = isinstance(generator, torch.Generator)
        seen["generator_device"] = (generator.device, torch.cuda.default_generators[0].device)
        x = torch.randn(64, 64, device="cuda", generator=generator)
        seen["x"] = x.device.type
        seen["host_generator"] = torch.Generator().device.type
        torch.nn.functional.dropout(torch.ones(8, device="cuda"), 0.5)

    result = _run(job, a100, stack24)
    assert seen["after_torch_seed"] == 3
    assert seen["initial"] == 5 and seen["random_module"] == 6
    assert seen["state"] == (torch.uint8, "cpu") and seen["restored"] is True
    assert seen["generators"] == 1 and seen["forked"] == 6
    assert seen["generator"] is True and seen["x"] == "cuda" and seen["host_generator"] == "cpu"
    assert seen["generator_device"] == (torch.device("cuda", 0), torch.device("cuda", 0))
    assert 64 * 64 * 4 in [size for size, _ in allocations(result.trace)]
    assert torch.cuda.default_generators == ()  # restored
    assert torch.Generator is torch._C.Generator


# -- CUDA graphs, NVTX, profilers --------------------------------------------------------------
def test_cuda_graphs_run_once_replays_allocate_nothing_and_say_so(a100, stack24):
    seen = {}

    def job():
        model = torch.nn.Linear(64, 64).cuda()
        static = torch.randn(8, 64, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=torch.cuda.graph_pool_handle()):
            out = model(static)
        seen["out"] = out.shape
        count = len(allocations_seen())
        for _ in range(3):
            graph.replay()
        seen["replay_allocs"] = len(allocations_seen()) - count
        graphed = torch.cuda.make_graphed_callables(model, (static,))
        seen["graphed"] = graphed is model
        seen["capturing"] = torch.cuda.is_current_stream_capturing()

    trace_holder = {}

    def allocations_seen():
        return allocations(trace_holder["trace"])

    import peakmem.capture.runner as runner

    original = runner.CaptureSession

    def session(*args, **kwargs):
        made = original(*args, **kwargs)
        trace_holder["trace"] = made.trace
        return made

    runner.CaptureSession = session
    try:
        result = _run(job, a100, stack24)
    finally:
        runner.CaptureSession = original
    assert seen == {"out": torch.Size([8, 64]), "replay_allocs": 0, "graphed": True, "capturing": False}
    assert 8 * 64 * 4 in [size for size, tag in allocations(result.trace) if tag.op.startswith("addmm")]
    assert any("CUDA graphs were modelled" in note and "private memory pool" in note for note in result.notes)


def test_nvtx_and_profilers_run_without_a_gpu(a100, stack24):
    seen = {}

    def job():
        model = torch.nn.Linear(16, 16).cuda()
        torch.cuda.nvtx.range_push("step")
        torch.cuda.nvtx.mark("here")
        handle = torch.cuda.nvtx.range_start("r")
        torch.cuda.nvtx.range_end(handle)
        with torch.cuda.nvtx.range("forward"):
            model(torch.randn(2, 16, device="cuda"))
        torch.cuda.nvtx.range_pop()
        with torch.autograd.profiler.emit_nvtx():
            model(torch.randn(2, 16, device="cuda")).sum().backward()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            model(torch.randn(2, 16, device="cuda")).sum().backward()
        seen["events"] = len(prof.key_averages()) > 0
        with torch.autograd.profiler.profile(use_device="cuda"):
            model(torch.randn(2, 16, device="cuda"))
        with torch.cuda.profiler.profile():
            torch.cuda.profiler.start()
            torch.cuda.profiler.stop()

    result = _run(job, a100, stack24)
    assert seen["events"] is True
    assert any("profiler ran without its CUDA activity" in note for note in result.notes)


def test_memory_history_calls_never_crash(a100, stack24, tmp_path):
    def job():
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python")
        torch.ones(10, device="cuda")
        torch.cuda.memory._dump_snapshot(str(tmp_path / "x.pickle"))
        torch.cuda.memory._record_memory_history(enabled=None)

    _run(job, a100, stack24)
    assert (tmp_path / "x.pickle").stat().st_size > 0


# -- processes and threads ---------------------------------------------------------------------
def _spawned(rank, size, seen):
    seen.append(rank)
    torch.empty(size, dtype=torch.uint8, device="cuda")


def test_spawn_of_one_process_runs_in_process_as_rank_0(a100, stack24):
    import torch.multiprocessing as mp

    seen = []

    def job():
        mp.spawn(_spawned, args=(12345, seen), nprocs=1)
        context = mp.start_processes(_spawned, args=(23456, seen), nprocs=1, join=False)
        assert context.join()

    result = _run(job, a100, stack24)
    assert seen == [0, 0]
    sizes = [size for size, _ in allocations(result.trace)]
    assert 12345 in sizes and 23456 in sizes


@pytest.mark.parametrize("how", ["spawn", "start_processes"])
def test_spawn_of_several_processes_runs_rank_0(a100, stack24, how):
    import torch.multiprocessing as mp

    seen = []
    result = capture_callable(
        lambda: getattr(mp, how)(_spawned, args=(4321, seen), nprocs=4), gpu=a100, stack=stack24
    )
    assert result.error is None, result.error_text
    assert seen == [0]
    assert 4321 in [size for size, _ in allocations(result.trace)]
    assert any("spawn of 4 processes: rank 0" in note for note in result.notes)


def test_threads_started_during_the_capture_are_traced(a100, stack24):
    seen = {}
    lock = threading.Lock()

    def work(size):
        x = torch.empty(size, dtype=torch.uint8, device="cuda")
        model = torch.nn.Linear(8, 8).cuda()
        y = model(torch.randn(2, 8, device="cuda"))
        with lock:
            seen[size] = (x.device.type, y.shape)

    def job():
        threads = [threading.Thread(target=work, args=(1111 + n,)) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(work, [2222, 3333, 4444]))

    result = _run(job, a100, stack24)
    sizes = [size for size, _ in allocations(result.trace)]
    for size in (1111, 1112, 1113, 2222, 3333, 4444):
        assert seen[size] == ("cuda", torch.Size([2, 8]))
        assert size in sizes
    # after the capture new threads run plain torch again
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("device", torch.zeros(1).device.type))
    thread.start()
    thread.join()
    assert out == {"device": "cpu"}


# -- default device ----------------------------------------------------------------------------
def test_set_default_device_cuda_puts_factories_on_the_fake_device(a100, stack24):
    seen = {}

    def job():
        torch.set_default_device("cuda")
        seen["default"] = torch.get_default_device()
        seen["randn"] = torch.randn(4, 4).device.type
        seen["linear"] = torch.nn.Linear(4, 4).weight.device.type
        seen["explicit_cpu"] = torch.zeros(2, device="cpu").device.type
        torch.set_default_device("cpu")
        seen["back"] = torch.zeros(2).device.type
        torch.set_default_device("cuda:0")
        with torch.device("cuda"):
            seen["context"] = torch.empty(3).device.type
            seen["context_default"] = torch.get_default_device()
        torch.set_default_device(None)
        with torch.device("cuda:0"):
            seen["plain_context_default"] = torch.get_default_device()
        seen["none"] = torch.get_default_device()

    result = _run(job, a100, stack24)
    assert seen == {
        "default": torch.device("cuda", 0),
        "randn": "cuda",
        "linear": "cuda",
        "explicit_cpu": "cpu",
        "back": "cpu",
        "context": "cuda",
        "context_default": torch.device("cuda", 0),
        "plain_context_default": torch.device("cuda", 0),
        "none": torch.device("cpu"),
    }
    assert 4 * 4 * 4 in [size for size, _ in allocations(result.trace)]
    assert torch.get_default_device() == torch.device("cpu")
    assert torch.zeros(1).device.type == "cpu"


# -- sparse ------------------------------------------------------------------------------------
def test_sparse_device_tensors_are_tracked_by_their_indices_and_values(a100, stack24):
    seen = {}

    def job():
        indices = torch.tensor([[0, 1, 2], [1, 2, 3]], device="cuda")
        values = torch.ones(3, device="cuda")
        sparse = torch.sparse_coo_tensor(indices, values, (4, 4))
        seen["layout"] = sparse.layout
        seen["allocated"] = torch.cuda.memory_allocated()

    result = _run(job, a100, stack24)
    assert seen["layout"] == torch.sparse_coo
    assert seen["allocated"] > 0
    assert [size for size, _ in allocations(result.trace)][:2] == [6 * 8, 3 * 4]


def test_sparse_compute_is_refused_with_one_clear_line(a100, stack24):
    def job():
        indices = torch.tensor([[0, 1], [1, 2]], device="cuda")
        sparse = torch.sparse_coo_tensor(indices, torch.ones(2, device="cuda"), (4, 4))
        # sparse @ dense runs on fake tensors (cuda_rules/sparse.py); sparse @ sparse does not
        torch.sparse.mm(sparse, sparse)

    with pytest.raises(api.EstimateError) as raised:
        api.estimate(job, gpu=a100, torch_version="2.4.1", mode="auto")
    assert isinstance(raised.value.capture.error, Unsupported)
    assert "peakmem does not support sparse CUDA tensors in eager mode yet" in str(raised.value.capture.error)


# -- AMP, attention backends, queries ----------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "mode"),
    [
        (lambda: torch.amp.GradScaler("cuda"), "fake"),
        (lambda: torch.cuda.amp.GradScaler(), "fake"),
        (lambda: torch.amp.GradScaler("cuda"), "eager"),
    ],
)
def test_grad_scaler_steps_with_fake_values(a100, stack24, make, mode):
    seen = {}

    def job():
        model = torch.nn.Linear(32, 32).cuda()
        opt = torch.optim.AdamW(model.parameters())
        scaler = make()
        for _ in range(3):
            with torch.cuda.amp.autocast():
                loss = model(torch.randn(4, 32, device="cuda")).float().mean()  # no fp16 overflow
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        seen["scale"] = scaler.get_scale()
        seen["state"] = scaler.state_dict()["scale"]

    result = _run(job, a100, stack24, steps=10, mode=mode)
    assert result.steps == 3
    assert seen == {"scale": 65536.0, "state": 65536.0}  # eager: real values, no overflow


def test_runtime_queries_a_script_makes(a100, stack24):
    seen = {}

    def job():
        seen["available"] = (
            torch.cuda.is_available(),
            torch.backends.cuda.is_built(),
            torch.backends.cudnn.is_available(),
            torch.version.cuda is not None,
            torch.backends.cudnn.version() is not None,
            torch.cuda.is_initialized(),
        )
        props = torch.cuda.get_device_properties(0)
        seen["props"] = (
            props.name,
            props.total_memory,
            props.multi_processor_count,
            props.max_threads_per_block,
            props.warp_size,
            props.regs_per_multiprocessor,
            props.L2_cache_size >= 0,
        )
        with torch.cuda.device(0) as device:
            seen["device_ctx"] = device.idx
        x = torch.ones(16, device="cuda")
        with torch.cuda.device_of(x):
            pass
        seen["share"] = x.share_memory_() is x and x.is_shared()
        seen["pin"] = torch.ones(4).pin_memory().device.type
        with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=True):
            q = torch.randn(1, 2, 8, 16, device="cuda")
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION]):
            torch.nn.functional.scaled_dot_product_attention(q, q, q)
        module = torch.nn.Linear(4, 4).cuda()
        module.share_memory()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            y = torch.randn(8, device="cuda")
        torch.cuda.current_stream().wait_stream(side)
        y.record_stream(torch.cuda.current_stream())  # the data-prefetcher pattern
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        module(torch.randn(2, 4, device="cuda"))
        end.record()
        end.synchronize()
        seen["elapsed"] = start.elapsed_time(end)
        seen["cudart"] = torch.cuda.cudart().cudaMemGetInfo(0) == torch.cuda.mem_get_info()

    _run(job, a100, stack24)
    # `is_initialized()` is False before the job's first initialising call (capture/cuda_state.py)
    assert seen["available"] == (True, True, True, True, True, False)
    assert seen["props"] == ("NVIDIA A100-SXM4-40GB", a100.total_memory_bytes, 108, 1024, 32, 65536, True)
    assert seen["device_ctx"] == 0
    assert seen["share"] is True and seen["pin"] == "cpu"
    assert seen["elapsed"] > 0 and seen["cudart"] is True
    assert torch.version.cuda is None or torch.backends.cuda.is_built()  # restored


def test_unsupported_in_fake_mode_is_not_retried_in_eager(a100):
    import torch.multiprocessing as mp

    def job():
        loss = torch.ones(2, device="cuda").sum()
        float(loss)  # a host read: auto mode would normally retry a failure in eager
        mp.spawn(_spawned, args=(1, []), nprocs=0)

    with pytest.raises(api.EstimateError) as raised:
        api.estimate(job, gpu=a100, torch_version="2.4.1", mode="auto")
    capture = raised.value.capture
    assert capture.mode == "fake" and isinstance(capture.error, Unsupported)


def test_data_parallel_on_the_one_device_runs_the_module(a100, stack24):
    seen = {}

    def job():
        model = torch.nn.DataParallel(torch.nn.Linear(16, 16)).cuda()
        out = model(torch.randn(4, 16, device="cuda"))
        out.sum().backward()
        seen["out"] = out.shape

    result = _run(job, a100, stack24)
    assert seen["out"] == torch.Size([4, 16])
    assert 4 * 16 * 4 in [size for size, tag in allocations(result.trace) if tag.op.startswith("addmm")]


def test_data_parallel_over_more_gpus_than_the_job_sees_fails_as_on_cuda(a100, stack24,
                                                                       monkeypatch):
    """DataParallel over several GPUs is supported (capture/data_parallel.py) over the GPUs the
    job sees (`CUDA_VISIBLE_DEVICES`); naming more fails as CUDA does on a machine with fewer:
    an invalid device ordinal, the job's own error, not a peakmem limit."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def job():
        model = torch.nn.DataParallel(torch.nn.Linear(16, 16).cuda(), device_ids=[0, 1, 2])
        model(torch.randn(4, 16, device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert not isinstance(result.error, Unsupported)
    assert "invalid device ordinal" in str(result.error)
    assert "the job sees 1 GPUs" in str(result.error)


def test_legacy_cuda_tensor_types_make_fake_device_tensors(a100, stack24):
    seen = {}

    def job():
        seen["sized"] = torch.cuda.FloatTensor(3, 4)
        seen["data"] = torch.cuda.LongTensor([1, 2, 3])
        seen["size_obj"] = torch.cuda.HalfTensor(torch.Size([5]))
        host = torch.ones(6)
        seen["type_class"] = host.type(torch.cuda.DoubleTensor)
        seen["type_name"] = host.type("torch.cuda.HalfTensor")
        seen["type_str"] = seen["sized"].type()
        seen["isinstance"] = (
            isinstance(seen["sized"], torch.cuda.FloatTensor),
            isinstance(seen["sized"], torch.cuda.LongTensor),
            isinstance(host, torch.cuda.FloatTensor),
        )
        torch.set_default_tensor_type(torch.cuda.HalfTensor)
        seen["default"] = torch.zeros(7)
        seen["nccl"] = torch.cuda.nccl.version()

    result = _run(job, a100, stack24)
    shapes = {k: (tuple(v.shape), v.dtype, v.device.type) for k, v in seen.items() if isinstance(v, torch.Tensor)}
    assert shapes == {
        "sized": ((3, 4), torch.float32, "meta"),
        "data": ((3,), torch.int64, "meta"),
        "size_obj": ((5,), torch.float16, "meta"),
        "type_class": ((6,), torch.float64, "meta"),
        "type_name": ((6,), torch.float16, "meta"),
        "default": ((7,), torch.float16, "meta"),
    }
    assert seen["type_str"] == "torch.cuda.FloatTensor"
    assert seen["isinstance"] == (True, False, False)
    assert isinstance(seen["nccl"], tuple)
    sizes = [size for size, _ in allocations(result.trace)]
    assert 3 * 4 * 4 in sizes and 6 * 8 in sizes and 7 * 2 in sizes
    assert torch.get_default_dtype() == torch.float32 and torch.zeros(1).device.type == "cpu"


def test_a_bare_device_ordinal_is_a_cuda_device(a100, stack24):
    """`torch.device(0)` raises on a CPU-only torch (no accelerator); FSDP's device_id and
    device_map code build devices that way."""
    seen = {}

    def job():
        dev = torch.device(0)
        seen["ordinal"] = dev
        seen["is_device"] = isinstance(dev, torch.device) and type(dev) is type(torch.device("cpu"))
        seen["plain"] = (torch.device("cuda", 0), torch.device("cpu"), torch.device(type="cuda"))
        seen["tensor"] = torch.ones(2, device=torch.device(0)).device

    _run(job, a100, stack24)
    assert seen["ordinal"] == torch.device("cuda", 0) and seen["is_device"] is True
    assert seen["plain"] == (torch.device("cuda", 0), torch.device("cpu"), torch.device("cuda"))
    assert seen["tensor"] == torch.device("cuda", 0)
    with pytest.raises(RuntimeError):  # undone after the capture
        torch.device(0)


def test_devices_pickle_as_torch_device_during_the_capture(a100, stack24):
    import io
    import pickle

    seen = {}

    def job():
        buffer = io.BytesIO()
        torch.save({"device": torch.device(0), "cpu": torch.device("cpu")}, buffer)
        buffer.seek(0)
        seen["weights_only"] = torch.load(buffer, weights_only=True)
        seen["pickle"] = pickle.loads(pickle.dumps(torch.device("cuda", 0)))
        seen["blob"] = pickle.dumps(torch.device("cpu"))

    _run(job, a100, stack24)
    assert seen["weights_only"] == {"device": torch.device("cuda", 0), "cpu": torch.device("cpu")}
    assert seen["pickle"] == torch.device("cuda", 0)
    assert pickle.loads(seen["blob"]) == torch.device("cpu")  # outside: the real type
    assert b"peakmem" not in seen["blob"]
