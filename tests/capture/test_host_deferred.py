"""Models built on the host stay fake until their values are needed (capture.host_deferred)."""

import pytest
import torch
from torch import nn

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(256, 512), nn.ReLU(), nn.LayerNorm(512), nn.Linear(512, 128), nn.Embedding(64, 128)
    )


def _step(model: nn.Module, dtype=torch.float32) -> None:
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2):
        x = torch.randn(32, 256, device="cuda", dtype=dtype)
        model[:4](x).float().sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def _sizes(result):
    return sorted(size for size, _tag in allocations(result.trace))


def _device_built() -> None:
    with torch.device("cuda"):
        model = _mlp()
    _step(model)


@pytest.mark.parametrize(
    "move",
    [
        lambda m: m.to("cuda"),
        lambda m: m.cuda(),
        lambda m: m.to(0),
        lambda m: m.to(torch.device("cuda:0")),
        lambda m: m.to(device="cuda"),
    ],
    ids=["to-cuda", "cuda()", "to-0", "to-device", "to-kw"],
)
def test_host_built_then_moved_matches_device_built(move, a100, stack24):
    def host_built() -> None:
        model = move(_mlp())
        _step(model)

    host = capture_callable(host_built, gpu=a100, stack=stack24, steps=2)
    device = capture_callable(_device_built, gpu=a100, stack=stack24, steps=2)
    assert host.error is None, host.error_text
    assert _sizes(host) == _sizes(device)
    assert host.peak_device_bytes == device.peak_device_bytes
    params = sum(p.numel() * 4 for p in _mlp().parameters())
    moved = [s for s, t in allocations(host.trace, phase="other") if t.op.startswith("_to_copy")]
    assert sum(moved) == params  # every parameter moved once, nothing counted while built
    assert any("kept fake" in note for note in host.notes)


def test_moved_with_dtype_counts_the_moved_size(a100, stack24):
    def job() -> None:
        model = _mlp().to("cuda", dtype=torch.bfloat16)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    params = sum(p.numel() * 2 for p in _mlp().parameters())
    assert sum(_sizes(result)) == params
    assert result.peak_device_bytes == params


def test_tiny_llama_built_on_host_matches_device_built(a100, stack24):
    from peakmem.capture import vision_ops

    vision_ops.declare_torchvision_ops()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128)

    def run(model) -> None:
        optimizer = torch.optim.AdamW(model.parameters())
        ids = torch.randint(0, 512, (2, 16), device="cuda")
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    def host() -> None:
        torch.manual_seed(0)
        run(LlamaForCausalLM(cfg).to("cuda"))

    def device() -> None:
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
        run(model)

    on_host = capture_callable(host, gpu=a100, stack=stack24, steps=1)
    on_device = capture_callable(device, gpu=a100, stack=stack24, steps=1)
    assert on_host.error is None, on_host.error_text
    assert on_device.error is None, on_device.error_text
    # built on the device, RoPE's frequencies are computed there (small temporaries); the
    # training step's allocations and the peak are the same
    for phase in ("forward", "backward", "optimizer"):
        assert [s for s, _ in allocations(on_host.trace, phase=phase)] == [
            s for s, _ in allocations(on_device.trace, phase=phase)
        ]
    assert on_host.peak_device_bytes == on_device.peak_device_bytes


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_building_a_2gb_model_on_the_host_costs_no_host_memory(a100, stack24):
    grown = {}

    def job() -> None:
        before = _rss_bytes()
        model = nn.Sequential(*(nn.Linear(4096, 4096) for _ in range(32)))  # 2.1 GB of fp32
        model.to(torch.bfloat16)  # host-side conversion: fake too
        grown["build"] = _rss_bytes() - before
        model.to("cuda")

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert grown["build"] < 200 * 2**20
    assert result.peak_device_bytes == 32 * (4096 * 4096 + 4096) * 2


def test_host_only_training_job_runs_and_makes_no_device_allocations(a100, stack24):
    seen = {}

    def job() -> None:
        torch.manual_seed(0)
        data = torch.randn(64, 256)
        target = torch.randint(0, 128, (64,))
        loader = torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(data, target), batch_size=16
        )
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            seen["loss"] = loss.item()
        seen["weight"] = model[0].weight[0, :3].tolist()
        seen["data"] = data[0, 0].item()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=100)
    assert result.error is None, result.error_text
    assert allocations(result.trace) == []
    assert result.peak_device_bytes == 0
    assert seen["loss"] > 0
    assert len(seen["weight"]) == 3
    torch.manual_seed(0)
    assert seen["data"] == torch.randn(64, 256)[0, 0].item()  # real host data stays real
    assert any("placeholder values when read" in note for note in result.notes)


def test_host_reads_replay_the_recorded_init(a100, stack24):
    seen = {}

    def job() -> None:
        norm = nn.LayerNorm(8192)  # weight ones, bias zeros: replayed exactly
        linear = nn.Linear(128, 128)  # kaiming uniform within +-1/sqrt(128)
        linear.weight.data.fill_(0.5)
        seen["norm"] = (norm.weight.sum().item(), norm.bias.abs().sum().item())
        seen["linear"] = float(linear.weight[3, 4])
        seen["print"] = repr(nn.Linear(128, 128).weight)
        seen["kaiming"] = nn.Linear(256, 256).weight.abs().max().item()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["norm"] == (8192.0, 0.0)
    assert seen["linear"] == 0.5
    assert "tensor(" in seen["print"] and "meta" not in seen["print"]
    assert 0 < seen["kaiming"] <= 1 / 16  # kaiming uniform's bound for 256 inputs


def test_host_tensors_made_outside_construction_stay_real(a100, stack24):
    seen = {}

    def job() -> None:
        big = torch.ones(1024, 1024)
        seen["real"] = not big.is_meta and big.sum().item() == 1024 * 1024
        big.to("cuda")

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["real"]
    assert _sizes(result) == [4 * 2**20]
    assert allocations(result.trace)[0][1].category == "input"


def test_user_meta_tensors_are_not_device_memory(a100, stack24):
    def job() -> None:
        a = torch.empty(1024, 1024, device="meta")
        with torch.device("meta"):
            b = torch.zeros(2048, 1024)
            model = nn.Linear(1024, 1024)
        c = (a + 1) @ b.t()
        assert c.shape == (1024, 2048)
        del model

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert allocations(result.trace) == []


def test_empty_init_then_to_empty_counts_device_memory_once(a100, stack24):
    from accelerate import init_empty_weights

    def job() -> None:
        with init_empty_weights():
            model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 512))
        assert all(p.is_meta for p in model.parameters())
        model.to_empty(device="cuda")
        model(torch.randn(4, 1024, device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    params = (1024 * 1024 + 1024 + 1024 * 512 + 512) * 4
    made = [s for s, t in allocations(result.trace, phase="other")]
    assert sum(made) == params + 4 * 1024 * 4


def test_meta_model_moved_to_the_device_is_counted_once(a100, stack24):
    def job() -> None:
        with torch.device("meta"):
            model = nn.Linear(1024, 1024)
        model.to("cuda")

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert _sizes(result) == [4 * 1024, 4 * 1024 * 1024]


def test_host_storages_die_with_their_tensors(a100, stack24):
    kinds = {}

    def job() -> None:
        model = nn.Linear(1024, 1024)
        kinds["built"] = sum(1 for k in _session_kinds().values() if k == "host")
        model.to("cuda")
        kinds["moved"] = sum(1 for k in _session_kinds().values() if k == "host")

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert kinds["built"] >= 1
    assert kinds["moved"] == 0
    assert len(allocations(result.trace)) == 2


def _session_kinds() -> dict:
    mode = torch.overrides._get_current_function_mode_stack()[-1]
    return mode.session.storage_kinds


def test_a_host_buffer_written_in_place_stays_fake(a100, stack24):
    class Agent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(64, 4)
            self.register_buffer("memory", torch.zeros(100_000, 64))  # 25 MB replay buffer

    seen = {}

    def job() -> None:
        agent = Agent()
        for i in range(300):  # more writes than are replayed: the buffer reads as zeros after
            agent.memory[i] = torch.randn(64)
        agent.memory[3, :2] = torch.tensor([1.0, 2.0])
        seen["row"] = agent.memory[3, :3].tolist()
        agent.net.cuda()

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1)
    assert result.error is None, result.error_text
    assert seen["row"] == [1.0, 2.0, 0.0]
    assert _sizes(result) == [16, 1024]  # only the network moved
