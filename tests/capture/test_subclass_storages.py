"""Tensor subclasses are counted through their inner storages, once, at their real size:
torchao's low-bit optimizer states (8-bit, 4-bit, fp8), NF4 and float8 weights, DTensor."""

import pytest
import torch

from peakmem.capture import capture_callable, fused_updates
from peakmem.capture.subclass_storages import inner_tensors, storage_tensors
from tests.capture.capture_helpers import allocations, live_at_end

torchao = pytest.importorskip("torchao")

N = 1024


def inner_bytes(tensor) -> int:
    return sum(t.untyped_storage().nbytes() for t in inner_tensors(tensor))


@pytest.mark.parametrize("name", ["AdamW8bit", "AdamW4bit", "AdamWFp8"])
def test_torchao_low_bit_optimizer_state_is_counted_at_its_real_size(a100, stack24, name):
    from torchao import optim as ao_optim

    optimizer_class = getattr(ao_optim, name)
    reference = torch.nn.Parameter(torch.randn(N, N))
    block = optimizer_class([reference]).block_size
    state_bytes = sum(
        inner_bytes(optimizer_class._subclass_zeros(reference, signed, block)) for signed in (True, False)
    )

    def job():
        model = torch.nn.Linear(N, N, bias=False).cuda()
        optimizer = optimizer_class(model.parameters())
        for _ in range(2):
            model(torch.randn(8, N, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    sizes = [size for size, _tag in allocations(result.trace)]
    state = sum(size for size, _tag in allocations(result.trace, "optimizer_state"))
    qmaps = 2 * 256 * 4  # at most: the lookup tables (made from host lists: inputs)
    assert state_bytes - qmaps <= state <= state_bytes
    assert state < N * N * 4  # far below the two fp32 states (8 MiB) the outer tensors claim
    # the update is torch.compile(fullgraph=True)'d: Inductor fuses it, so its fp32 temporaries
    # (the eager run makes several of N * N * 4 bytes) are not device memory
    assert [size for size, _tag in allocations(result.trace, phase="optimizer") if size >= N * N] == [
        size for size, tag in allocations(result.trace, phase="optimizer") if tag.category == "optimizer_state" and size >= N * N
    ]
    assert fused_updates.NOTE in result.notes
    assert sizes.count(N * N * 4) == 3  # the weight and the gradient of each of the 2 steps


def test_nf4_weights_are_their_packed_storages(a100, stack24):
    try:  # torchao < 0.16 (pyproject's pin; torchtune 0.6 needs it)
        from torchao.dtypes.nf4tensor import to_nf4
    except ImportError:  # where later releases moved it
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    kept = []

    def job():
        weight = torch.randn(N, N, dtype=torch.bfloat16, device="cuda")
        kept.append(to_nf4(weight))
        del weight

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    nf4 = kept[0]
    live = live_at_end(result.trace)
    assert sum(live) <= inner_bytes(nf4) + 4096  # the packed 4-bit data, scalers, the table
    assert N * N // 2 in live  # the 4-bit data: half a byte per value
    assert N * N * 2 not in live  # the bf16 source is gone; the NF4 tensor claims no bf16 copy


def test_a_checkpoint_loads_into_nf4_weights_on_the_device(a100, stack24):
    """QLoRA's load (torchtune): `load_state_dict` of host bf16 weights into a module whose
    weights are NF4 made on the device copies each one in (`NF4Tensor.copy_`: the host tensor
    moved to the weight's device, quantized, its packed parts copied in). The NF4 tensor was
    made for the device the weight reported (`cuda`); a wrapper made on `cuda` in a CPU-only
    torch refused `copy_` (a CUDA device guard) and its dispatch's `.to(original.device)`.
    Wrappers made for the device are now meta, as device tensors are (library_patches)."""
    try:
        from torchao.dtypes.nf4tensor import to_nf4
    except ImportError:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    seen = {}

    def job():
        weight = torch.randn(N, N, dtype=torch.bfloat16, device="cuda")
        layer = torch.nn.Linear(N, N, bias=False)
        layer.weight = torch.nn.Parameter(to_nf4(weight), requires_grad=False)
        del weight
        seen["before"] = (layer.weight.device, layer.weight.is_cuda)
        layer.load_state_dict({"weight": torch.randn(N, N, dtype=torch.bfloat16)})
        seen["after"] = (layer.weight.device, type(layer.weight).__name__)
        kept.append(layer)

    kept = []
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert seen == {"before": (torch.device("cuda", 0), True),
                    "after": (torch.device("cuda", 0), "NF4Tensor")}, seen
    sizes = [size for size, _ in allocations(result.trace)]
    # the host weight moved to the device for quantizing: one bf16 copy, freed again
    assert N * N * 2 in sizes
    live = live_at_end(result.trace)
    assert N * N // 2 in live and N * N * 2 not in live


def test_float8_tensors_are_their_fp8_data_and_scale(a100, stack24):
    from torchao.float8.float8_training_tensor import hp_tensor_and_scale_to_float8

    kept = []

    def job():
        weight = torch.randn(N, N, device="cuda")
        scale = torch.tensor(2.0, device="cuda")
        kept.append(hp_tensor_and_scale_to_float8(weight, scale, torch.float8_e4m3fn))
        del weight

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    live = live_at_end(result.trace)
    assert N * N in live  # one byte per value
    assert N * N * 4 not in live


def test_storage_tensors_keeps_plain_lists_and_expands_wrappers():
    plain = [torch.zeros(2), 3, None]
    assert storage_tensors(plain) is plain
    from torchao.optim.subclass_8bit import OptimState8bit

    state = OptimState8bit.zeros((64, 64), signed=True, block_size=256)
    expanded = storage_tensors([state, plain[0]])
    assert [t.dtype for t in expanded] == [torch.uint8, torch.float32, torch.float32, torch.float32]
    assert expanded[0].numel() == 64 * 64 and expanded[1].numel() == 64 * 64 // 256


def test_a_dtensor_is_its_local_shard():
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate

    if not dist.is_available():
        pytest.skip("torch.distributed is not built")
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])
        local = torch.zeros(16, 8)
        dtensor = DTensor.from_local(local, mesh, [Replicate()])
        [inner] = inner_tensors(dtensor)
        assert inner.untyped_storage().nbytes() == 16 * 8 * 4
        assert type(inner) is torch.Tensor
    finally:
        if started:
            dist.destroy_process_group()


def test_a_fullgraph_compiled_update_that_returns_something_keeps_its_temporaries(a100, stack24):
    def job():
        weight = torch.nn.Parameter(torch.zeros(N, N, device="cuda"))
        weight.grad = torch.ones(N, N, device="cuda")

        def update(p, g):  # returns a value: not an in-place fused update
            return (p.float() - 0.1 * g).sum()

        class Step(torch.optim.Optimizer):
            def step(self, closure=None):
                torch.compile(update, fullgraph=True)(weight, weight.grad)

        Step([weight], {}).step()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert any(size == N * N * 4 for size, _tag in allocations(result.trace, phase="optimizer"))
    assert fused_updates.NOTE not in result.notes
