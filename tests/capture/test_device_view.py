"""Device tensors as the job sees them: `cuda:0` tensors (capture/device_view.py), while the
capture's own machinery still sees meta tensors."""

import io

import pytest
import torch
from torch import nn

from peakmem.capture import capture_callable
from peakmem.capture.device_view import JOB_DEVICE
from peakmem.cuda_rules.true_device import is_meta, true_device
from peakmem.trace.events import EventKind
from tests.capture.capture_helpers import allocations


def _run(job, gpu, stack, **kwargs):
    result = capture_callable(job, gpu=gpu, stack=stack, **kwargs)
    assert result.error is None, result.error_text
    return result


def test_device_tensors_report_cuda_0_to_the_job(a100, stack24):
    seen = {}

    def job():
        x = torch.randn(2, 3, device="cuda")
        seen["device"] = x.device
        seen["type"] = x.device.type
        seen["index"] = x.device.index
        seen["str"] = str(x.device)
        seen["is_cuda"] = x.is_cuda
        seen["is_meta"] = x.is_meta
        seen["is_cpu"] = x.is_cpu
        seen["get_device"] = x.get_device()
        seen["eq_cuda0"] = x.device == torch.device("cuda:0")
        seen["eq_cuda_0"] = x.device == torch.device("cuda", 0)
        seen["ne_cuda"] = x.device != torch.device("cuda")  # as on CUDA: no index != index 0
        seen["view"] = x[0].device  # views and results of ops too
        seen["sum"] = (x * 2).sum().device
        host = torch.randn(2)
        seen["host"] = (host.device, host.is_cuda, host.get_device())
        seen["cpu_copy"] = x.cpu().device
        seen["same_as_new"] = torch.empty(1, device=x.device).device

    result = _run(job, a100, stack24)
    assert seen["device"] == JOB_DEVICE and seen["type"] == "cuda" and seen["index"] == 0
    assert seen["str"] == "cuda:0"
    assert seen["is_cuda"] is True and seen["is_meta"] is False and seen["is_cpu"] is False
    assert seen["get_device"] == 0
    assert seen["eq_cuda0"] and seen["eq_cuda_0"] and seen["ne_cuda"]
    assert seen["view"] == JOB_DEVICE and seen["sum"] == JOB_DEVICE
    assert seen["host"] == (torch.device("cpu"), False, -1)
    assert seen["cpu_copy"] == torch.device("cpu")
    assert seen["same_as_new"] == JOB_DEVICE
    # `torch.empty(1, device=x.device)` was recorded as a device allocation: the capture saw meta
    assert any(size == 4 for size, _ in allocations(result.trace, op="empty"))


def test_storage_kinds_decide_what_a_meta_tensor_reports(a100, stack24):
    """Meta storages marked "host" (host-deferred) report cpu; "meta" (the job's own) meta."""
    seen = {}

    def job():
        device, host, own = (torch.empty(4, device="cuda") for _ in range(3))
        session = _current_session()
        session.storage_kinds[id(host.untyped_storage())] = "host"
        session.storage_kinds[id(own.untyped_storage())] = "meta"
        seen["device"] = (device.device.type, device.is_cuda, device.is_meta, device.get_device())
        seen["host"] = (host.device.type, host.is_cuda, host.is_cpu, host.get_device())
        seen["own"] = (own.device.type, own.is_cuda, own.is_meta, own.get_device())

    _run(job, a100, stack24)
    assert seen["device"] == ("cuda", True, False, 0)
    assert seen["host"] == ("cpu", False, True, -1)
    assert seen["own"] == ("meta", False, True, -1)


def _marks(trace):
    return [
        trace.tag_of(index).op
        for index, (kind, *_rest) in enumerate(trace.events())
        if kind == EventKind.MARK
    ]


def _current_session():
    from torch.overrides import _get_current_function_mode_stack

    from peakmem.capture.capture_modes import CaptureModes
    from peakmem.capture.device_map import CudaAsMeta

    return next(m for m in _get_current_function_mode_stack()
                if isinstance(m, (CaptureModes, CudaAsMeta))).session


def test_the_capture_machinery_still_sees_meta_tensors(a100, stack24):
    """Outside the job's view (rules, the recorder, the phase hooks) tensors are meta: the
    parameters, gradients and optimizer state are recognised and tracked."""
    seen = {}

    def job():
        model = nn.Linear(64, 64).cuda()
        seen["true"] = (true_device(model.weight).type, is_meta(model.weight))
        optimizer = torch.optim.Adam(model.parameters())
        for _ in range(3):
            model(torch.randn(8, 64, device="cuda")).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    result = _run(job, a100, stack24)
    assert seen["true"] == ("meta", True)
    params = (64 * 64 + 64) * 4
    assert sum(size for size, _ in allocations(result.trace, category="parameter")) == params
    assert sum(size for size, _ in allocations(result.trace, category="optimizer_state")) >= 2 * params


def test_repr_prints_values_and_the_cuda_device(a100, stack24):
    seen = {}

    def job():
        x = torch.ones(2, 2, device="cuda", dtype=torch.float16, requires_grad=True)
        seen["x"] = repr(x)
        seen["y"] = str(x * 2)
        seen["param"] = repr(nn.Linear(2, 1).cuda().bias)

    result = _run(job, a100, stack24, mode="eager")
    assert seen["x"] == (
        "tensor([[1., 1.],\n        [1., 1.]], device='cuda:0', dtype=torch.float16, "
        "requires_grad=True)"
    )
    assert seen["y"].startswith("tensor([[2., 2.],") and "device='cuda:0'" in seen["y"]
    assert "grad_fn=<MulBackward0>" in seen["y"]
    assert seen["param"].startswith("Parameter containing:\ntensor([") and "cuda:0" in seen["param"]
    assert result.host_reads == 0


def test_repr_in_fake_mode_prints_placeholders_without_counting_a_host_read(a100, stack24):
    seen = {}

    def job():
        seen["x"] = repr(torch.ones(3, device="cuda"))

    result = _run(job, a100, stack24)
    assert seen["x"] == "tensor([0., 0., 0.], device='cuda:0')"
    assert result.host_reads == 0


def test_gradients_report_cuda(a100, stack24):
    seen = {}

    def job():
        model = nn.Linear(4, 4).cuda()
        model(torch.randn(2, 4, device="cuda")).sum().backward()
        seen["grad"] = (model.weight.grad.device, model.weight.grad.is_cuda)

        def hook(grad):
            seen["hook"] = grad.device

        x = torch.randn(3, device="cuda", requires_grad=True)
        x.register_hook(hook)
        (x * 2).sum().backward()

    _run(job, a100, stack24)
    assert seen["grad"] == (JOB_DEVICE, True)
    assert seen["hook"] == JOB_DEVICE  # hooks run during backward see the job's view too


def test_int_devices_for_modules_and_tensors(a100, stack24):
    seen = {}

    def job():
        rank = 0
        seen["to0"] = nn.Linear(2, 2).to(0).weight.device
        seen["to_rank"] = nn.Linear(2, 2).to(rank).weight.device
        seen["to_kw"] = nn.Linear(2, 2).to(device=0).weight.device
        seen["to_dtype"] = nn.Linear(2, 2).to(0, torch.float16).weight.dtype
        seen["cuda0"] = nn.Linear(2, 2).cuda(0).weight.device
        seen["tensor_to0"] = torch.ones(2).to(0).device
        seen["tensor_cuda0"] = torch.ones(2).cuda(0).device
        seen["factory"] = torch.zeros(2, device=0).device

    _run(job, a100, stack24)
    assert seen.pop("to_dtype") == torch.float16
    assert set(seen.values()) == {JOB_DEVICE}, seen


def test_torch_save_in_the_job(a100, stack24):
    seen = {}

    def job():
        model = nn.Linear(4, 4).cuda()
        buffer = io.BytesIO()
        torch.save({"state": model.state_dict(), "device": model.weight.device}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)
        seen["device"] = loaded["device"]
        seen["weight"] = (loaded["state"]["weight"].shape, loaded["state"]["weight"].device)

    _run(job, a100, stack24)
    assert seen["device"] == JOB_DEVICE
    assert seen["weight"] == (torch.Size([4, 4]), JOB_DEVICE)


def test_cuda_rng_state_can_be_saved_and_restored(a100, stack24):
    seen = {}

    def job():
        state = torch.cuda.get_rng_state()
        torch.cuda.set_rng_state(state)
        seen["state"] = (state.device.type, state.dtype)
        seen["all"] = len(torch.cuda.get_rng_state_all())
        with torch.random.fork_rng(devices=[0], device_type="cuda"):
            torch.randn(2, device="cuda")

    _run(job, a100, stack24)
    assert seen == {"state": ("cpu", torch.uint8), "all": 1}


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpoint_recomputes_under_the_jobs_autocast(a100, stack24, reentrant):
    """`torch.utils.checkpoint` infers the device type from its inputs (cuda) and recomputes the
    forward under the same `torch.autocast("cuda")` state: no dtype mismatch, the same dtypes."""
    from torch.utils.checkpoint import checkpoint

    dtypes = []

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

        def forward(self, x):
            hidden = self.up(x)
            dtypes.append((hidden.dtype, hidden.device.type, torch.is_autocast_enabled("cuda")))
            return self.down(torch.relu(hidden))

    def job(use_checkpoint):
        model = Block().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            x = torch.randn(8, 16, device="cuda", requires_grad=True)
            with torch.autocast("cuda", dtype=torch.float16):
                run = (lambda x: checkpoint(model, x, use_reentrant=reentrant)) if use_checkpoint else model
                out = run(x)
                loss = out.float().sum()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    plain = _run(job, a100, stack24, use_checkpoint=False)
    plain_dtypes = list(dtypes)
    dtypes.clear()
    checkpointed = _run(job, a100, stack24, use_checkpoint=True)
    assert plain_dtypes == [(torch.float16, "cuda", True)] * 3
    assert dtypes == [(torch.float16, "cuda", True)] * 6  # forward and recomputation
    # one backward phase per step: the reentrant checkpoint's inner backward stays inside it
    assert _marks(checkpointed.trace).count("backward") == _marks(plain.trace).count("backward") == 3


def test_checkpoint_saves_fewer_activations_than_the_plain_run(a100, stack24):
    from torch.utils.checkpoint import checkpoint

    def job(use_checkpoint):
        model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            x = torch.randn(64, 256, device="cuda", requires_grad=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = checkpoint(model, x, use_reentrant=False) if use_checkpoint else model(x)
            out.float().sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    plain = _run(job, a100, stack24, use_checkpoint=False)
    checkpointed = _run(job, a100, stack24, use_checkpoint=True)
    activations = [
        sum(size for size, _ in allocations(r.trace, category="activation"))
        for r in (plain, checkpointed)
    ]
    assert activations[1] < activations[0]
    # the recomputation allocated in bf16: the backward's recomputed hidden layer is 64x1024x2
    recomputed = [size for size, tag in allocations(checkpointed.trace, phase="backward")]
    assert 64 * 1024 * 2 in recomputed


def test_save_on_cpu_hooks_run_in_the_jobs_view(a100, stack24):
    def job():
        model = nn.Linear(32, 32).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            with torch.autograd.graph.save_on_cpu():
                loss = model(torch.randn(4, 32, device="cuda")).sum()
            loss.backward()
            optimizer.step()

    assert _run(job, a100, stack24).steps == 3


def test_format_and_record_stream_on_device_tensors(a100, stack24):
    seen = {}

    def job():
        x = torch.ones(2, device="cuda")
        seen["format"] = f"{x}"
        seen["scalar"] = f"{x.sum():.1f}"
        x.record_stream(torch.cuda.current_stream())
        seen["recorded"] = True

    result = _run(job, a100, stack24, mode="eager")
    assert seen == {"format": "tensor([1., 1.], device='cuda:0')", "scalar": "2.0", "recorded": True}
    assert result.host_reads == 0  # eager: real values, nothing assumed


def test_autocast_keyed_on_the_tensors_device_type(a100, stack24):
    """`torch.autocast(device_type=x.device.type)` (common in training loops) is CUDA autocast."""
    seen = {}

    def job():
        layer = nn.Linear(8, 8).cuda()
        x = torch.randn(4, 8, device="cuda")
        with torch.autocast(device_type=x.device.type, dtype=torch.float16):
            seen["dtype"] = layer(x).dtype
        scaler = torch.amp.GradScaler(x.device.type)
        seen["scaler"] = scaler.is_enabled()

    _run(job, a100, stack24)
    assert seen == {"dtype": torch.float16, "scaler": True}


def test_printing_a_huge_device_tensor_takes_no_host_memory(a100, stack24):
    seen = {}

    def job():
        huge = torch.empty(2**32, device="cuda", dtype=torch.float16)  # 8 GiB on the device
        seen["repr"] = repr(huge)

    _run(job, a100, stack24)
    assert seen["repr"] == "tensor([0., 0., 0.,  ..., 0., 0., 0.], device='cuda:0', dtype=torch.float16)"


def test_device_storages_have_distinct_stable_addresses(a100, stack24):
    """transformers' save_pretrained tells shared tensors apart by storage address: meta
    storages would all sit at 0."""
    seen = {}

    def job():
        a = torch.empty(1000, device="cuda")
        b = torch.empty(1000, device="cuda")
        view = a[10:]
        seen["distinct"] = a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
        seen["nonzero"] = a.data_ptr() != 0 and b.data_ptr() != 0
        seen["stable"] = a.data_ptr() == a.data_ptr() == a.untyped_storage().data_ptr()
        seen["view_offset"] = view.data_ptr() - a.data_ptr()
        seen["view_shares"] = view.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
        seen["apart"] = abs(a.data_ptr() - b.data_ptr()) >= 4000

    _run(job, a100, stack24)
    assert seen == {
        "distinct": True, "nonzero": True, "stable": True, "view_offset": 40,
        "view_shares": True, "apart": True,
    }
    assert torch.empty(3, device="meta").untyped_storage().data_ptr() == 0  # undone afterwards


def test_validity_checks_pass_in_fake_mode(a100, stack24):
    """torch.distributions validates its arguments with `torch._is_all_true(constraint.check(x))`
    and raises when it reads False; fake mode has no values to check, so the check passes (it
    used to read placeholder zeros and fail, sending the job to eager mode). Other reads of
    device values still read zeros."""
    from peakmem.capture import capture_callable

    seen = {}

    def job() -> None:
        layer = torch.nn.Linear(16, 2).cuda()
        out = layer(torch.randn(8, 16, device="cuda"))
        normal = torch.distributions.Normal(out[:, 0], out[:, 1].exp())
        loss = -normal.log_prob(torch.zeros(8, device="cuda")).mean()
        loss.backward()
        torch._check_tensor_all(out.isfinite(), lambda: "not finite")
        seen["any"] = bool(out.isnan().any())
        seen["sample"] = tuple(torch.distributions.Categorical(logits=out).sample().shape)

    result = capture_callable(job, gpu=a100, stack=stack24, steps=1, mode="fake")
    assert result.error is None, result.error_text
    assert seen == {"any": False, "sample": (8,)}
    assert result.host_reads == 1  # the isnan().any() read; the validity checks are not counted
