"""Eager mode (real CPU values beside the meta device tensors) and auto mode's fallback to it."""

import textwrap

import pytest
import torch
from torch import nn

from peakmem.capture import capture_callable, capture_command
from peakmem.estimate import EstimateError, estimate, estimate_capture
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations


def _capture(job, gpu, stack, mode):
    result = capture_callable(job, gpu=gpu, stack=stack, mode=mode)
    assert result.error is None, result.error_text
    assert result.mode == mode
    return result


# -- the same trace as fake mode -------------------------------------------------------------


def mlp_job():
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(3):
        x, y = torch.randn(16, 32).cuda(), torch.randint(0, 10, (16,)).cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def cnn_job():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.1),
        nn.Flatten(), nn.Linear(8 * 16 * 16, 10),
    ).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        x, y = torch.randn(4, 3, 16, 16).cuda(), torch.randint(0, 10, (4,)).cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def transformer_job(dtype=None):
    emb = nn.Embedding(100, 64).cuda()
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True).cuda()
    head = nn.Linear(64, 100).cuda()
    optimizer = torch.optim.AdamW([*emb.parameters(), *layer.parameters(), *head.parameters()])
    for _ in range(3):
        tokens = torch.randint(0, 100, (2, 16), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype is not None):
            logits = head(layer(emb(tokens)))
        loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize(
    "job",
    [mlp_job, cnn_job, transformer_job, lambda: transformer_job(torch.bfloat16)],
    ids=["mlp", "cnn", "transformer", "transformer-bf16-autocast"],
)
def test_eager_gives_the_same_trace_and_peaks_as_fake(job, a100, stack24):
    fake = _capture(job, a100, stack24, "fake")
    eager = _capture(job, a100, stack24, "eager")
    fake_events, eager_events = list(fake.trace.events()), list(eager.trace.events())
    assert [(e[0], e[2]) for e in fake_events] == [(e[0], e[2]) for e in eager_events]
    assert [fake.trace.tag_of(i) for i in range(len(fake_events))] == [
        eager.trace.tag_of(i) for i in range(len(eager_events))
    ]
    peaks = [
        estimate_capture(c, a100, stack24, torch_version="2.4.1") for c in (fake, eager)
    ]
    assert peaks[0].peak_allocated_bytes == peaks[1].peak_allocated_bytes
    assert peaks[0].peak_reserved_bytes == peaks[1].peak_reserved_bytes
    assert [p.mode for p in peaks] == ["fake", "eager"]


def test_eager_values_are_real_through_fused_attention(a100, stack24):
    seen = {}

    def job():
        q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
        dq, dk, dv = (t.cuda().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
        out.float().sum().backward()
        seen["device"] = out.float().cpu()
        seen["grad"] = dq.grad.float().cpu()
        ref = [t.to(torch.bfloat16).float().requires_grad_() for t in (q, k, v)]
        expected = nn.functional.scaled_dot_product_attention(*ref, is_causal=True)
        expected.sum().backward()
        seen["host"], seen["host_grad"] = expected.detach(), ref[0].grad

    result = _capture(job, a100, stack24, "eager")
    assert allocations(result.trace, op="_scaled_dot_product_flash_attention")  # the fused path
    assert torch.allclose(seen["device"], seen["host"], atol=2e-2)
    assert torch.allclose(seen["grad"], seen["host_grad"], atol=5e-2)


def test_eager_values_are_real_through_cudnn_attention():
    """On the H200 with torch 2.11 a bf16 call with a mask takes cuDNN attention (cuda_rules/
    sdpa.py): its shadows come from the math it stands for, forward and backward."""
    seen = {}

    def job():
        q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))
        mask = torch.randn(8, 8)
        dq, dk, dv = (t.cuda().to(torch.bfloat16).requires_grad_() for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(dq, dk, dv, mask.cuda().bfloat16())
        out.float().sum().backward()
        seen["device"], seen["grad"] = out.float().cpu(), dq.grad.float().cpu()
        ref = [t.to(torch.bfloat16).float().requires_grad_() for t in (q, k, v)]
        expected = nn.functional.scaled_dot_product_attention(*ref, mask.bfloat16().float())
        expected.sum().backward()
        seen["host"], seen["host_grad"] = expected.detach(), ref[0].grad

    result = _capture(job, load_gpu("h200"), load_stack("2.11"), "eager")
    assert result.error is None, result.error_text
    assert allocations(result.trace, op="_scaled_dot_product_cudnn_attention_backward")
    assert torch.allclose(seen["device"], seen["host"], atol=2e-2)
    assert torch.allclose(seen["grad"], seen["host_grad"], atol=5e-2)


# -- data-dependent sizes --------------------------------------------------------------------


def selection_job():
    # a permutation of 0..999: values fake mode does not know (an arange's it would carry:
    # capture/known_values.py)
    x = torch.randperm(1000, device="cuda")
    keep = x % 10 == 0  # 100 of 1000 selected
    indices = keep.nonzero()
    values = x.float()[keep]
    return indices, values


def test_nonzero_and_masks_are_exact_in_eager_and_bounded_in_fake(a100, stack24):
    fake = _capture(selection_job, a100, stack24, "fake")
    eager = _capture(selection_job, a100, stack24, "eager")
    assert [size for size, _ in allocations(fake.trace, op="nonzero")] == [1000 * 8]
    assert [size for size, _ in allocations(eager.trace, op="nonzero")] == [100 * 8]
    assert [size for size, _ in allocations(fake.trace, op="index")] == [1000 * 4]
    assert [size for size, _ in allocations(eager.trace, op="index")] == [100 * 4]
    assert set(fake.data_dependent) == {"aten::nonzero", "aten::index"}

    result = estimate(selection_job, gpu="a100-40gb", torch_version="2.4.1")  # auto
    assert result.mode == "fake" and result.mode_reason.startswith("auto")
    assert any("bounded from above" in a and "aten::nonzero" in a for a in result.assumptions)


def test_aten_ops_without_meta_kernels_run_for_real(a100, stack24):
    seen = {}

    def job():
        labels = torch.tensor([0, 1, 1, 3, 3, 3], device="cuda")
        seen["counts"] = torch.bincount(labels).tolist()
        unique, inverse = torch.unique(labels, return_inverse=True)
        seen["unique"], seen["inverse"] = unique.tolist(), inverse.tolist()

    fake = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert fake.fake_limit == "aten::bincount has no meta kernel"
    result = estimate(job, gpu="a100-40gb")
    assert result.mode == "eager" and "aten::bincount has no meta kernel" in result.mode_reason
    assert seen == {"counts": [1, 2, 0, 3], "unique": [0, 1, 3], "inverse": [0, 1, 1, 2, 2, 2]}
    assert [s for s, _ in allocations(result.capture.trace, op="bincount")] == [4 * 8]
    assert [s for s, _ in allocations(result.capture.trace, op="_unique2")] == [3 * 8, 6 * 8]


# -- .item() steering the job --------------------------------------------------------------


def item_job():
    counts = torch.randperm(2, device="cuda") + 3  # 3 and 4, values fake mode does not know
    rows = int(counts.sum().item())  # 7 on a GPU; fake mode reads 0
    buffer = torch.empty(rows, 1024, device="cuda")
    while counts.sum().item() > 0:  # runs 7 times for real, never in fake mode
        counts = (counts - 1).clamp(min=0)
    return buffer


def test_item_in_control_flow(a100, stack24):
    eager = _capture(item_job, a100, stack24, "eager")
    fake = _capture(item_job, a100, stack24, "fake")
    assert [s for s, _ in allocations(eager.trace, op="empty")] == [7 * 1024 * 4]
    assert [s for s, _ in allocations(fake.trace, op="empty")] == []  # zero rows: nothing
    assert len(allocations(eager.trace, op="clamp")) == 4 and not allocations(fake.trace, op="clamp")
    assert fake.host_reads == 2

    result = estimate(item_job, gpu="a100-40gb", torch_version="2.4.1")  # auto keeps fake
    assert result.mode == "fake"
    assert any("host read" in a and "--mode eager" in a for a in result.assumptions)


def test_auto_reruns_in_eager_when_the_job_fails_on_fake_values():
    def job():
        model = nn.Linear(8, 8).cuda()
        total = model(torch.ones(4, 8, device="cuda")).abs().sum().item()
        return 1.0 / total  # ZeroDivisionError with fake mode's zeros

    with pytest.raises(EstimateError, match="ZeroDivisionError"):
        estimate(job, gpu="l4", mode="fake")
    result = estimate(job, gpu="l4")
    assert result.mode == "eager"
    assert "ZeroDivisionError" in result.mode_reason and "host read" in result.mode_reason


# -- custom ops without a meta kernel ------------------------------------------------------


@torch.library.custom_op("peakmem_test::double_it", mutates_args=(), device_types="cpu")
def double_it(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(x.numpy() * 2)


def custom_op_job():
    x = torch.ones(256, 256, device="cuda")
    y = double_it(x)
    assert y.sum().item() == 2 * 256 * 256 or not torch.cuda.is_available()
    return y * 3


def test_custom_op_without_meta_kernel(a100, stack24):
    fake = capture_callable(custom_op_job, gpu=a100, stack=stack24, mode="fake")
    assert fake.fake_limit == "peakmem_test::double_it (a custom op) has no meta/fake kernel"
    message = fake.error_text.strip()
    assert "\n" not in message and "double_it" in message and "--mode eager" in message
    assert "test_eager.py" in message  # where the job called it

    eager = _capture(custom_op_job, a100, stack24, "eager")
    assert [s for s, _ in allocations(eager.trace, op="double_it")] == [256 * 256 * 4]

    with pytest.raises(EstimateError, match="no meta/fake kernel.*--mode eager"):
        estimate(custom_op_job, gpu="a100-40gb", mode="fake")
    result = estimate(custom_op_job, gpu="a100-40gb")  # auto
    assert result.mode == "eager"
    assert "peakmem_test::double_it" in result.mode_reason
    assert result.to_json()["mode_reason"] == result.mode_reason


def test_an_unsupported_op_in_a_script_falls_back_to_eager(tmp_path, a100, stack24):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch

        @torch.library.custom_op("peakmem_test::script_op", mutates_args=(), device_types="cpu")
        def script_op(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        model = torch.nn.Linear(16, 16).cuda()
        with torch.no_grad():
            print(script_op(model(torch.randn(4, 16, device="cuda"))).sum().item())
    """))
    fake = capture_command(["python", str(script)], gpu=a100, stack=stack24, mode="fake")
    assert "script_op" in fake.error_text and "train.py:10" in fake.error_text
    from peakmem.estimate import estimate_command

    # in this process (auto mode's rerun in the job's child process: test_cli_says_which_mode_...)
    result = estimate_command(["python", str(script)], gpu=a100, isolate=False)
    assert result.mode == "eager" and "script_op" in result.mode_reason


# -- host RAM ---------------------------------------------------------------------------------


def test_eager_never_runs_past_host_ram(monkeypatch, a100, stack24):
    def big_job():
        weights = torch.zeros(1024, 1024, device="cuda")  # 4 MiB
        return double_it(weights)

    monkeypatch.setenv("PEAKMEM_EAGER_RAM_BYTES", str(2**20))  # 1 MiB allowed
    with pytest.raises(EstimateError, match=r"fake mode could not run .*double_it.* needs at least"):
        estimate(big_job, gpu="a100-40gb")
    eager = capture_callable(big_job, gpu=a100, stack=stack24, mode="eager")
    assert eager.error_text.startswith("peakmem: eager mode needs more than")


def test_cli_says_which_mode_ran_and_why(tmp_path, monkeypatch):
    import copy
    import json

    from click.testing import CliRunner

    import peakmem.estimate
    from peakmem.cli.main import main

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch

        @torch.library.custom_op("peakmem_test::cli_op", mutates_args=(), device_types="cpu")
        def cli_op(x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        with torch.no_grad():
            cli_op(torch.nn.Linear(8, 8).cuda()(torch.randn(2, 8, device="cuda")))
    """))

    def run(*args):
        return CliRunner().invoke(main, ["estimate", "--gpu", "l4", *args, "--", "python",
                                         str(script)], catch_exceptions=False)

    fake = run("--mode", "fake")
    assert fake.exit_code == 3  # unsupported (reason fake_limit)
    assert fake.output.strip().splitlines() == [
        "peakmem: fake mode cannot run this job: peakmem_test::cli_op (a custom op) has no "
        "meta/fake kernel, called at train.py:9; rerun with --mode eager (or --mode auto) to run "
        "it for real on the CPU"
    ]
    # the JSON and the human runs render one auto-mode estimate (its fake and eager child
    # processes run once): the second CLI call gets a copy of the first's result, for the same
    # arguments
    real, estimates = peakmem.estimate.estimate_command, []

    def estimate_once(command, **options):
        if not estimates:
            estimates.append(((command, repr(options)), real(command, **options)))
        assert estimates[0][0] == (command, repr(options))
        return copy.deepcopy(estimates[0][1])

    monkeypatch.setattr(peakmem.estimate, "estimate_command", estimate_once)
    auto = run("--json")
    assert auto.exit_code == 0, auto.output
    payload = json.loads(auto.stdout)
    assert payload["mode"] == "eager" and "cli_op" in payload["mode_reason"]
    human = run()
    assert human.exit_code == 0, human.output  # 70 where the CLI called with other arguments
    assert len(estimates) == 1
    assert "mode eager" in human.stdout and "fake mode could not run" in human.stdout.replace("\n", " ")
