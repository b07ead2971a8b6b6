"""Loading weights during a capture reads only their metadata (capture.weights_loading)."""

import json
import sys

import pytest
import torch
from torch import nn

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

safetensors_torch = pytest.importorskip("safetensors.torch")

TENSORS = {"a": (256, 128), "b": (512,), "c": (64, 64, 4)}
TOTAL = sum(4 * torch.Size(shape).numel() for shape in TENSORS.values())


def _write(tmp_path):
    torch.manual_seed(0)
    tensors = {name: torch.randn(shape) for name, shape in TENSORS.items()}
    path = tmp_path / "weights.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    return path, tensors


def _sizes(result):
    return sorted(size for size, _tag in allocations(result.trace))


def test_safetensors_load_file_onto_the_device(tmp_path, a100, stack24):
    path, _ = _write(tmp_path)
    seen = {}

    def job() -> None:
        from safetensors.torch import load_file

        loaded = load_file(str(path), device="cuda")
        seen["shapes"] = {k: tuple(v.shape) for k, v in loaded.items()}

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["shapes"] == TENSORS
    assert sum(_sizes(result)) == TOTAL


def test_safetensors_on_the_host_is_fake_until_read(tmp_path, a100, stack24):
    path, tensors = _write(tmp_path)
    seen = {}

    def job() -> None:
        from safetensors import safe_open
        from safetensors.torch import load_file

        loaded = load_file(str(path))
        seen["no_device_memory"] = torch.cuda.memory_allocated() == 0
        seen["value"] = loaded["a"][3, 4].item()  # read from the file
        seen["half"] = loaded["a"].half().dtype  # a host op stays fake
        moved = {k: v.to("cuda") for k, v in loaded.items()}
        with safe_open(str(path), framework="pt", device="cuda") as handle:
            seen["keys"] = sorted(handle.keys())
            moved["c2"] = handle.get_tensor("c")
            moved["a-slice"] = handle.get_slice("a")[:128]

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["no_device_memory"]
    assert seen["value"] == tensors["a"][3, 4].item()
    assert seen["half"] == torch.float16
    assert seen["keys"] == sorted(TENSORS)
    c_bytes = 4 * 64 * 64 * 4
    assert sum(_sizes(result)) == TOTAL + c_bytes + 128 * 128 * 4


def test_torch_load_then_load_state_dict(tmp_path, a100, stack24):
    torch.manual_seed(0)
    saved = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))
    path = tmp_path / "model.pt"
    torch.save(saved.state_dict(), path)
    params = sum(p.numel() * 4 for p in saved.parameters())
    expected = saved[0].weight[5, 7].item()
    seen = {}

    def job() -> None:
        model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256))
        state = torch.load(path, map_location="cpu")
        seen["value"] = state["0.weight"][5, 7].item()
        model.load_state_dict(state)
        model.to("cuda")
        seen["device_state"] = {
            k: v.shape for k, v in torch.load(path, map_location="cuda").items()
        }
        device_model = nn.Sequential(nn.Linear(256, 512), nn.Linear(512, 256)).cuda()
        device_model.load_state_dict(state)

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["value"] == expected
    assert seen["device_state"]["0.weight"] == (512, 256)
    # moved model + map_location="cuda" state + the device model; load_state_dict copies in place
    assert sum(_sizes(result)) == 3 * params


def test_loaded_host_checkpoint_trains_on_the_host(tmp_path, a100, stack24):
    torch.manual_seed(0)
    saved = nn.Linear(256, 256)
    path = tmp_path / "linear.pt"
    torch.save(saved.state_dict(), path)
    expected = saved(torch.ones(1, 256)).detach()
    seen = {}

    def job() -> None:
        model = nn.Linear(256, 256)
        model.load_state_dict(torch.load(path))
        seen["out"] = model(torch.ones(1, 256)).detach()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert torch.allclose(seen["out"], expected)  # the weights were read from the checkpoint
    assert allocations(result.trace) == []


@pytest.fixture(scope="module")
def tiny_llama_dirs(tmp_path_factory):
    """A tiny LlamaForCausalLM saved with save_pretrained (outside any capture), single-file
    and sharded."""
    from peakmem.capture import vision_ops

    vision_ops.declare_torchvision_ops()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128)
    model = LlamaForCausalLM(cfg)
    root = tmp_path_factory.mktemp("llama")
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="100KB")
    params = sum(p.numel() for p in model.parameters())
    value = model.model.layers[1].mlp.down_proj.weight[2, 3].item()
    return root, params, value


@pytest.mark.parametrize(
    ("directory", "kwargs", "bytes_per_param", "moved"),
    [
        ("single", {}, 4, True),
        ("sharded", {}, 4, True),
        ("single", {"dtype": torch.bfloat16}, 2, True),
        ("sharded", {"device_map": "cuda"}, 4, False),
        ("single", {"device_map": "cuda", "dtype": torch.bfloat16}, 2, False),
        ("sharded", {"device_map": "auto", "dtype": torch.bfloat16}, 2, False),  # torch.device(0)
    ],
)
def test_from_pretrained_reads_only_metadata(
    tiny_llama_dirs, directory, kwargs, bytes_per_param, moved, a100, stack24
):
    root, params, _ = tiny_llama_dirs
    if directory == "sharded":
        assert (root / "sharded" / "model.safetensors.index.json").exists()
        assert len(json.loads((root / "sharded" / "model.safetensors.index.json").read_text())[
            "weight_map"]) > 1
    seen = {}

    def job() -> None:
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(root / directory, **kwargs)
        seen["before_move"] = torch.cuda.memory_allocated()
        if moved:
            model = model.to("cuda")
        seen["allocated"] = torch.cuda.memory_allocated()
        optimizer = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 1000, (1, 16), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    if moved:
        assert seen["before_move"] == 0  # loaded on the host: nothing on the device yet
    # parameters (+ RoPE's tiny inv_freq buffer) on the device; memory_allocated() is the
    # simulated allocator's, which rounds each of the ~22 tensors up to 512 bytes
    assert params * bytes_per_param <= seen["allocated"] <= params * bytes_per_param + 512 * 24


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_loading_never_holds_the_weights_in_host_memory(tmp_path, a100, stack24):
    weights = {f"w{i}": torch.ones(2048, 2048) for i in range(4)}  # 64 MiB
    safetensors_torch.save_file(weights, str(tmp_path / "big.safetensors"))
    torch.save(weights, tmp_path / "big.pt")
    safetensors_torch.save_file({"x": torch.ones(4096)}, str(tmp_path / "small.safetensors"))
    del weights
    grown = {}

    def job() -> None:
        from safetensors.torch import load_file

        load_file(str(tmp_path / "small.safetensors"))  # one-time imports (sympy for meta shapes)
        before = _rss_bytes()
        on_device = {k: v.to("cuda") for k, v in load_file(str(tmp_path / "big.safetensors")).items()}
        loaded = torch.load(tmp_path / "big.pt", map_location="cpu")
        halves = {k: v.half() for k, v in loaded.items()}  # host ops stay fake
        also = torch.load(tmp_path / "big.pt", map_location="cuda")
        grown["rss"] = _rss_bytes() - before
        grown["keys"] = (len(on_device), len(halves), len(also))

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert grown["keys"] == (4, 4, 4)
    assert grown["rss"] < 16 * 2**20
    assert sum(_sizes(result)) == 2 * 64 * 2**20


def test_from_pretrained_host_reads_read_the_checkpoint(tiny_llama_dirs, a100, stack24):
    root, _, value = tiny_llama_dirs
    seen = {}

    def job() -> None:
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(root / "sharded")
        seen["fp32"] = model.model.layers[1].mlp.down_proj.weight[2, 3].item()
        model = LlamaForCausalLM.from_pretrained(root / "single", dtype=torch.bfloat16)
        seen["bf16"] = model.model.layers[1].mlp.down_proj.weight[2, 3].item()
        ids = torch.randint(0, 1000, (1, 8))
        seen["loss"] = model(input_ids=ids, labels=ids).loss.item()  # on the host, real weights

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["fp32"] == value
    assert seen["bf16"] == torch.tensor(value).bfloat16().item()
    assert 5 < seen["loss"] < 9  # about log(1000) for random weights, not a zero-weight model
    assert allocations(result.trace) == []
    assert not any("placeholder" in note for note in result.notes)


def test_torch_load_without_map_location_puts_gpu_tensors_on_the_device(tmp_path, a100, stack24):
    import torch.serialization as serialization

    path = tmp_path / "gpu.pt"
    weight = torch.ones(256, 256)
    original = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"  # as if saved from a GPU
    try:
        torch.save({"w": weight, "t": weight.t(), "small": torch.ones(3)}, path)
    finally:
        serialization.location_tag = original
    seen = {}

    def job() -> None:
        state = torch.load(path)
        seen["cuda"] = torch.cuda.memory_allocated()
        seen["shapes"] = {k: tuple(v.shape) for k, v in state.items()}

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["shapes"] == {"w": (256, 256), "t": (256, 256), "small": (3,)}
    # one device storage for the weight and its transposed view (shared, as on a GPU)
    assert seen["cuda"] == 256 * 256 * 4 + 512  # the allocator rounds 12 bytes up to 512


@pytest.mark.parametrize(
    "map_location",
    [
        pytest.param(lambda storage, loc: storage.cuda(), id="callable-storage.cuda"),
        pytest.param(lambda storage, loc: storage.cuda(0), id="callable-storage.cuda(0)"),
        pytest.param(lambda storage, loc: "cuda:0", id="callable-returns-location"),
        pytest.param({"cpu": "cuda:0"}, id="dict-to-gpu"),
    ],
)
def test_torch_load_with_a_map_location_callable_or_dict_to_the_gpu(
    tmp_path, a100, stack24, map_location
):
    """Older scripts' `torch.load(p, map_location=lambda storage, loc: storage.cuda())` (a CPU
    torch cannot make a CUDA storage) and `map_location={"cuda:1": "cuda:0"}`-style dicts: the
    mapped storages end on the device, once each (a tensor and its view share one)."""
    path = tmp_path / "ckpt.pt"
    weight = torch.ones(256, 256)
    torch.save({"model": {"w": weight, "t": weight.t()}, "epoch": 3}, path)
    seen = {}

    def job() -> None:
        state = torch.load(path, map_location=map_location)
        seen["devices"] = {k: v.device.type for k, v in state["model"].items()}
        seen["epoch"] = state["epoch"]
        seen["cuda"] = torch.cuda.memory_allocated()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen == {"devices": {"w": "cuda", "t": "cuda"}, "epoch": 3, "cuda": 256 * 256 * 4}


def test_torch_load_with_a_map_location_that_keeps_storages_on_the_host(tmp_path, a100, stack24):
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.full((4,), 2.0)}, path)
    seen = {}

    def job() -> None:
        state = torch.load(path, map_location=lambda storage, loc: storage)
        seen["w"] = (state["w"].device.type, state["w"].sum().item())
        seen["cuda"] = torch.cuda.memory_allocated()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen == {"w": ("cpu", 8.0), "cuda": 0}


def test_safe_open_bound_by_name_is_patched_in_each_capture(monkeypatch):
    """Every module binding safetensors' `safe_open` by name has it replaced for the job's run
    and put back after, found by a read of the loaded modules: a module that binds it
    after two captures is patched in the third, one that drops
    it is not."""
    import types

    import safetensors

    from peakmem.capture.weights_loading import weights_loading

    original = safetensors.safe_open
    early = types.ModuleType("peakmem_test_wl_early")
    early.safe_open = original
    late = types.ModuleType("peakmem_test_wl_late")
    late.other = 0
    monkeypatch.setitem(sys.modules, early.__name__, early)
    monkeypatch.setitem(sys.modules, late.__name__, late)
    for _ in range(2):
        with weights_loading(None, None):
            assert early.safe_open is not original and safetensors.safe_open is not original
            assert late.other == 0
        assert early.safe_open is original and safetensors.safe_open is original
    late.safe_open = original  # a new binding
    del early.safe_open
    with weights_loading(None, None):
        assert late.safe_open is not original
        assert "safe_open" not in vars(early)
    assert late.safe_open is original and safetensors.safe_open is original
