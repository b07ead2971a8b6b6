import pytest
import torch

import peakmem.estimate
from peakmem.estimate import Estimate, EstimateError, estimate
from peakmem.profiles import ProfileError

REQUIRED_KEYS = {
    "peak_bytes", "peak_reserved_bytes", "peak_allocated_bytes", "context_bytes",
    "breakdown", "fits", "mode", "seconds",
}


def train(width=256, steps=10):
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 8)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(32, width, device="cuda")).sum().backward()
        optimizer.step()


def test_estimate_a_callable():
    result = estimate(train, 128, gpu="a100-40gb", torch_version="2.4.1")
    assert isinstance(result, Estimate)
    assert result.steps == 3 and result.trained
    assert result.peak_bytes == result.context_bytes + result.peak_reserved_bytes
    assert result.peak_reserved_bytes >= result.peak_allocated_bytes > 0
    # parameters + gradients + 2 Adam moments of 128*128+128+128*8+8 floats are all live at the peak
    params = (128 * 128 + 128 + 128 * 8 + 8) * 4
    assert result.breakdown.by_category["optimizer_state"] >= 2 * params
    assert result.fits and result.headroom_bytes > 0
    payload = result.to_json()
    assert payload.keys() >= REQUIRED_KEYS
    assert payload["mode"] == "fake" and payload["estimate_kind"] == "training"


def test_the_package_itself_is_callable():
    result = peakmem.estimate(train, 64, gpu="h100-80gb", torch_version="2.4.1", steps=1)
    assert result.steps == 1
    # Hopper takes a 32 MiB cuBLAS workspace per handle
    assert result.breakdown.by_category["workspace"] >= 32 * 2**20


def test_a_job_larger_than_the_gpu_does_not_fit():
    def huge():
        model = torch.nn.Linear(65536, 65536, bias=False, device="cuda")  # 16 GiB of fp32
        optimizer = torch.optim.Adam(model.parameters())
        model(torch.randn(4, 65536, device="cuda")).sum().backward()
        optimizer.step()

    result = estimate(huge, gpu="rtx3060-12gb", torch_version="2.4.1")
    assert result.oom and not result.fits and result.headroom_bytes < 0
    assert result.peak_reserved_bytes > 3 * 16 * 2**30  # weights, gradient and two moments
    assert any("out of memory" in note for note in result.notes)


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ProfileError, match="a100-40gb.*h100-80gb"):
        estimate(train, gpu="gtx-9000")


def test_job_errors_and_unknown_modes_are_estimate_errors():
    def broken():
        raise RuntimeError("boom")

    with pytest.raises(EstimateError, match="boom"):
        estimate(broken, gpu="l4")
    with pytest.raises(EstimateError, match="boom"):
        estimate(broken, gpu="l4", mode="eager")
    with pytest.raises(EstimateError, match="unknown mode"):
        estimate(train, gpu="l4", mode="lazy")


def train_sized_on_device(build_on="cuda", steps=3, known=False):
    """Sizes computed on `build_on` and read back while the model is built (as torchvision's
    RegNet does under `with torch.device("cuda")`): fake mode reads zeros on the device for
    values it does not have (`randint`'s), the values of `arange` and the registry's ops on it
    (capture/known_values.py)."""
    with torch.device(build_on):
        base = torch.full((2,), 64) if known else torch.randint(64, 65, (2,))  # 64s either way
        widths = (torch.arange(1, 3) * base).tolist()  # [64, 128] on a GPU
        width = max(int(w) for w in widths) or 8
        model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.Linear(width, 4))
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(torch.randn(4, 16, device="cuda")).sum()
        loss.backward()
        optimizer.step()
        loss.item()


def test_host_reads_while_the_model_is_built_are_named_apart_from_the_loop():
    built = estimate(train_sized_on_device, gpu="a100-40gb", torch_version="2.4.1", mode="fake")
    assert any("before the first forward pass" in a for a in built.assumptions)
    looped = estimate(train_sized_on_device, "cpu", gpu="a100-40gb", torch_version="2.4.1",
                      mode="fake")  # only the loop's loss.item() reads the device
    assert any("host read(s) of device values" in a for a in looped.assumptions)
    assert not any("before the first forward pass" in a for a in looped.assumptions)
    exact = estimate(train_sized_on_device, gpu="a100-40gb", torch_version="2.4.1", mode="eager")
    assert exact.breakdown.by_category["parameter"] > built.breakdown.by_category["parameter"]


def test_sizes_computed_from_known_values_build_the_gpus_model_in_fake_mode():
    known = estimate(train_sized_on_device, "cuda", 3, True, gpu="a100-40gb",
                     torch_version="2.4.1", mode="fake")
    assert not any("before the first forward pass" in a for a in known.assumptions)
    exact = estimate(train_sized_on_device, "cuda", 3, True, gpu="a100-40gb",
                     torch_version="2.4.1", mode="eager")
    assert known.breakdown.by_category["parameter"] == exact.breakdown.by_category["parameter"]


def test_a_job_that_fits_only_by_releasing_the_cache_is_capped_and_says_so():
    """CUDACachingAllocator malloc: a cudaMalloc that fails frees the cached segments
    (release_cached_blocks) and retries, so the 5 GiB block cached by the first tensor is given
    back for the 8 GiB one, and reserved never holds both (13 GiB > a 12 GB card)."""
    gib = 2**30

    def release_and_retry():
        first = torch.empty(5 * gib, dtype=torch.uint8, device="cuda")
        del first
        second = torch.empty(8 * gib, dtype=torch.uint8, device="cuda")
        del second

    result = estimate(release_and_retry, gpu="rtx3060-12gb", torch_version="2.6.0")
    assert not result.oom and result.fits
    assert result.peak_reserved_bytes == 8 * gib
    assert result.simulation.num_alloc_retries == 1
    assert any("fits only by releasing its cached blocks: 1 cudaMalloc retry" in n for n in result.notes)
