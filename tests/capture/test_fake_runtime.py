import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def test_job_sees_a_cuda_device_shaped_like_the_target(a100, stack24):
    seen = {}

    def job():
        seen["available"] = torch.cuda.is_available()
        seen["count"] = torch.cuda.device_count()
        seen["name"] = torch.cuda.get_device_name(0)
        props = torch.cuda.get_device_properties(0)
        seen["total"] = props.total_memory
        seen["capability"] = (props.major, props.minor)
        seen["sms"] = props.multi_processor_count
        free, total = torch.cuda.mem_get_info()
        seen["mem_info"] = (free, total)
        torch.cuda.set_device(0)
        seen["current"] = torch.cuda.current_device()
        stream = torch.cuda.Stream()
        event = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream), torch.cuda.device(0):
            x = torch.ones(4, device="cuda")
        event.record()
        torch.cuda.synchronize()
        seen["bf16"] = torch.cuda.is_bf16_supported()
        seen["x_device"] = x.device.type
        seen["allocated"] = torch.cuda.memory_allocated()
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        seen["cudnn"] = torch.backends.cudnn.is_available() and torch.backends.cudnn.benchmark

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["available"] is True and seen["count"] == 1
    assert seen["name"] == "NVIDIA A100-SXM4-40GB"
    assert seen["total"] == a100.total_memory_bytes
    assert seen["capability"] == (8, 0) and seen["sms"] == 108
    assert seen["mem_info"][1] == a100.total_memory_bytes
    assert seen["mem_info"][0] < a100.total_memory_bytes
    assert seen["current"] == 0 and seen["bf16"] is True
    assert seen["x_device"] == "cuda"  # the job sees a CUDA tensor (meta underneath)
    assert seen["allocated"] == 512  # the caching allocator rounds to 512-byte blocks
    assert seen["cudnn"] is True


def test_runtime_is_restored_after_the_capture(a100, stack24):
    before = torch.cuda.is_available()
    capture_callable(lambda: torch.zeros(2, device="cuda"), gpu=a100, stack=stack24)
    assert torch.cuda.is_available() is before
    assert torch.Tensor.pin_memory is not None
    for name in ("pin_memory", "is_pinned", "type", "record_stream"):  # inherited: patch deleted
        assert name not in vars(torch.Tensor)
    assert torch.Tensor.type is torch._C.TensorBase.type
    assert type(torch.cuda.FloatTensor) is type(torch.FloatTensor)  # the real legacy type again
    assert torch.zeros(2).device.type == "cpu"
    assert torch.zeros(2).is_pinned() is False


def test_host_reads_of_device_tensors_do_not_crash(a100, stack24):
    seen = {}

    def job():
        loss = torch.randn(8, device="cuda").sum()
        seen["item"] = loss.item()
        seen["float"] = float(loss)
        seen["format"] = f"{loss:.3f}"
        seen["repr"] = repr(loss)
        seen["tolist"] = torch.ones(2, 3, device="cuda").tolist()
        host = torch.ones(2, 3, device="cuda").cpu()
        seen["cpu"] = (host.device.type, tuple(host.shape))
        seen["to_cpu"] = torch.ones(5, device="cuda").to("cpu", torch.float64).dtype
        seen["numpy"] = torch.ones(3, device="cuda").numpy().shape
        seen["bool"] = bool(torch.isnan(loss).any())

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert isinstance(seen["item"], float) and isinstance(seen["float"], float)
    assert seen["format"] == "0.000"
    assert seen["tolist"] == [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]  # a factory's: known values
    assert seen["cpu"] == ("cpu", (2, 3))
    assert seen["to_cpu"] == torch.float64
    assert seen["numpy"] == (3,)
    assert seen["bool"] is False


def test_module_cuda_and_factory_devices_map_to_the_fake_device(a100, stack24):
    seen = {}

    def job():
        model = torch.nn.Linear(4, 4).cuda()
        seen["param"] = next(model.parameters()).device.type
        seen["int_device"] = torch.empty(3, device=0).device.type
        seen["torch_device"] = torch.zeros(3, device=torch.device("cuda", 0)).device.type
        with torch.device("cuda"):
            seen["context"] = torch.empty(2).device.type
        seen["host"] = torch.empty(2).device.type

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {  # what the job sees (capture/device_view.py); meta underneath
        "param": "cuda",
        "int_device": "cuda",
        "torch_device": "cuda",
        "context": "cuda",
        "host": "cpu",
    }


def test_torch_compile_runs_eagerly_and_says_so(a100, stack24):
    def job():
        model = torch.compile(torch.nn.Linear(8, 8).cuda())

        @torch.compile(mode="reduce-overhead")
        def double(x):
            return x * 2

        double(model(torch.randn(2, 8, device="cuda")))
        # an OptimizedModule around the Linear, as torch.compile returns
        assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
        assert isinstance(model._orig_mod, torch.nn.Linear)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert any("torch.compile" in note for note in result.notes)


def test_checkpoints_load_onto_the_fake_device(a100, stack24, tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"weight": torch.randn(16, 16), "step": 3}, path)
    seen = {}

    def job():
        state = torch.load(path, map_location="cuda")
        seen["device"] = state["weight"].device.type
        seen["step"] = state["step"]
        with open(path, "rb") as handle:
            seen["file_object"] = torch.load(handle, map_location=torch.device("cuda", 0))["weight"].device.type

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"device": "cuda", "step": 3, "file_object": "cuda"}
    assert [size for size, _ in allocations(result.trace)] == [16 * 16 * 4, 16 * 16 * 4]


def test_backend_flags_the_job_sets_are_restored_after_the_capture(a100, stack24):
    from peakmem.capture import capture_callable

    before = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic

    def job():
        torch.backends.cudnn.benchmark = not before[0]
        torch.backends.cudnn.deterministic = not before[1]

    capture_callable(job, gpu=a100, stack=stack24)
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == before
