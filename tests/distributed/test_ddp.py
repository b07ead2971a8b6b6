"""DDP under the fake process group: the reducer's buckets are captured, to the byte."""

from collections import Counter

import pytest
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

IN, HIDDEN, OUT = 256, 512, 10
PARAM_BYTES = 4 * (IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT)


def set_world(monkeypatch, world: int, rank: int = 0) -> None:
    for name, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world,
                        "LOCAL_WORLD_SIZE": world, "GROUP_RANK": 0, "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": 29500}.items():
        monkeypatch.setenv(name, str(value))


def train(ddp: bool, layers: int = 0, **ddp_options):
    def job():
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if layers:
            model = torch.nn.Sequential(*(torch.nn.Linear(IN, IN) for _ in range(layers))).cuda()
        else:
            model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(),
                                        torch.nn.Linear(HIDDEN, OUT)).cuda()
        if ddp:
            dist.init_process_group("nccl")
            local = int(__import__("os").environ["LOCAL_RANK"])
            torch.cuda.set_device(local)
            model = DistributedDataParallel(model, device_ids=[local], **ddp_options)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            loss = model(torch.randn(32, IN, device="cuda")).sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return job


def ddp_extras(params: int, first: list[int], rebuilt: list[int]) -> Counter:
    """What DDP allocates on the device besides what the model and its training allocate:
    - the parameter-shape check: sizes and strides of every parameter (int64);
    - the initial sync of parameters from rank 0: all of them flattened (one 250 MiB chunk);
    - the buckets as built (`first`) and as rebuilt at the first iteration (`rebuilt`);
    - the rebuild's broadcast of the bucket order: parameter indices plus one, bucket sizes
      (int32)."""
    dims = 2 + 1  # a weight's and a bias's dimensions, per layer
    extras = Counter({8 * 2 * dims * params // 2: 1, sum(first): 1})
    extras.update(first)
    extras.update(rebuilt)
    extras.update([4 * (params + 1), 4 * len(rebuilt)])
    return extras


def sizes(result) -> Counter:
    return Counter(size for size, _ in allocations(result.trace))


def test_ddp_world_size_n_is_world_size_one_plus_buckets(monkeypatch, a100, stack24):
    plain = capture_callable(train(False), gpu=a100, stack=stack24, steps=3)
    assert plain.error is None, plain.error_text
    results = {}
    for world in (1, 4):
        set_world(monkeypatch, world)
        result = capture_callable(train(True), gpu=a100, stack=stack24, steps=3)
        assert result.error is None, result.error_text
        assert f"world size {world}" in " ".join(result.notes)
        results[world] = result
    extra = sizes(results[1]) - sizes(plain)
    assert extra == ddp_extras(params=4, first=[PARAM_BYTES], rebuilt=[PARAM_BYTES])
    assert sizes(plain) - sizes(results[1]) == Counter()
    assert sizes(results[4]) == sizes(results[1])
    assert results[4].peak_device_bytes == results[1].peak_device_bytes
    # the bucket lives through training: it raises the peak by at most itself (the plain run's
    # peak moment need not be the DDP run's)
    assert plain.peak_device_bytes < results[1].peak_device_bytes
    assert results[1].peak_device_bytes <= plain.peak_device_bytes + PARAM_BYTES


def test_gradient_as_bucket_view_drops_the_separate_gradients(monkeypatch, a100, stack24):
    set_world(monkeypatch, 2)
    copy = capture_callable(train(True), gpu=a100, stack=stack24, steps=3)
    view = capture_callable(train(True, gradient_as_bucket_view=True), gpu=a100, stack=stack24,
                            steps=3)
    assert copy.error is None and view.error is None, (copy.error_text, view.error_text)
    grads = lambda r: sorted(s for s, _ in allocations(r.trace, "gradient"))  # noqa: E731
    # copies: every step's gradients are tensors of their own; views: only whole buckets
    assert 4 * IN * HIDDEN in grads(copy)
    assert set(grads(view)) <= {PARAM_BYTES}
    assert view.peak_device_bytes <= copy.peak_device_bytes


@pytest.mark.parametrize(("cap_mb", "rebuilt"),
                         [(None, {4: 2}), (25, {8: 1}), (0.1, {1: 8})])
def test_bucket_cap_splits_the_buckets(monkeypatch, a100, stack24, cap_mb, rebuilt):
    """Eight Linear(256, 256) of 263168 bytes each. DDP starts with one bucket of every parameter;
    the first iteration's rebuild closes a bucket once it reaches its cap: 1 MiB (four layers)
    for the first bucket and 25 MiB after it by default, else `bucket_cap_mb` for all."""
    set_world(monkeypatch, 2)
    options = {} if cap_mb is None else {"bucket_cap_mb": cap_mb}
    result = capture_callable(train(True, layers=8, **options), gpu=a100, stack=stack24, steps=3)
    assert result.error is None, result.error_text
    plain = capture_callable(train(False, layers=8), gpu=a100, stack=stack24, steps=3)
    extra = sizes(result) - sizes(plain)
    layer = 4 * (IN * IN + IN)
    buckets = [layers * layer for layers, count in rebuilt.items() for _ in range(count)]
    assert extra == ddp_extras(params=16, first=[8 * layer], rebuilt=buckets)


def test_ddp_over_a_gloo_group(monkeypatch, a100, stack24):
    # pytorch/tutorials' DDP and ZeroRedundancyOptimizer recipes use gloo with GPU models: DDP's
    # C++ logger asks a group named "gloo" for its ProcessGroupGloo backend
    set_world(monkeypatch, 2)
    seen = {}

    def job():
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", rank=0, world_size=2)
        model = DistributedDataParallel(torch.nn.Linear(IN, OUT).to(0), device_ids=[0])
        model(torch.randn(8, IN, device="cuda")).sum().backward()
        seen["backend"] = dist.get_backend()
        dist.destroy_process_group()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode="fake")
    assert result.error is None, result.error_text
    assert seen == {"backend": "gloo"}
