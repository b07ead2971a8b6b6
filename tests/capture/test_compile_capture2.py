"""torch.compile around the capture: code compiled before it runs eagerly (noted, bracketed),
and Dynamo works after it in the same process."""

import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from peakmem.capture import capture_callable
from peakmem.trace.events import EventKind
from peakmem.trace.vocab import Mark
from tests.capture.capture_helpers import allocations

SRC = Path(__file__).resolve().parents[2] / "src"
B, H, M, D = 2, 4, 256, 16
FP32 = 4


def _marks(trace) -> list[str]:
    return [trace.tag_of(i).op for i, (kind, *_rest) in enumerate(trace.events())
            if kind == EventKind.MARK]


def _compile_notes(result) -> list[str]:
    return [note for note in result.notes if note.startswith("torch.compile was not applied")]


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x)) * 2


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.float().square().mean()


# compiled before any capture, as a module-level compile in a process that imported it first
COMPILED_LOSS = torch.compile(_loss, fullgraph=True)
COMPILED_FLEX = torch.compile(flex_attention)


@torch.compiler.disable
def _left_eager(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_code_compiled_before_the_capture_runs_eagerly_noted_and_bracketed(a100, stack24):
    def job(block):
        model = block.cuda()
        x = torch.randn(8, 64, device="cuda")
        COMPILED_LOSS(_left_eager(model(x))).backward()

    for _ in range(2):  # the same compiled function twice in one process, a module each time
        block = torch.compile(Block(), mode="reduce-overhead")
        result = capture_callable(functools.partial(job, block), gpu=a100, stack=stack24)
        assert result.error is None, result.error_text
        notes = _compile_notes(result)
        assert len(notes) == 1 and "Block" in notes[0] and "_loss" in notes[0]
        assert "_left_eager" not in notes[0]  # torch.compiler.disable: not compiled code
        assert "mode='reduce-overhead' also records CUDA graphs" in notes[0]  # Block's mode
        marks = [m for m in _marks(result.trace) if m.startswith("compiled region")]
        assert marks == [Mark.COMPILED.value, Mark.COMPILED_END.value] * 2
        params = 64 * 64 * FP32 + 64 * FP32
        assert sorted(s for s, _ in allocations(result.trace, "parameter")) == sorted(
            [64 * 64 * FP32, 64 * FP32])
        assert sum(s for s, _ in allocations(result.trace, "gradient")) == params


def test_flex_attention_compiled_before_the_capture_records_the_kernel_unnoted(a100, stack24):
    def job():
        q, k, v = (torch.randn(B, H, M, D, device="cuda", requires_grad=True) for _ in range(3))
        COMPILED_FLEX(q, k, v).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    sizes = [size for size, tag in allocations(result.trace) if tag.op == "flex_attention"]
    assert sizes == [B * H * M * D * FP32] + [B * H * M * FP32] * 2
    assert _compile_notes(result) == []


_AFTER_A_CAPTURE = """
import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention
from peakmem.estimate import estimate

def job():
    model = torch.nn.Linear(8, 8).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 8, device="cuda")).sum().backward()  # imports torch._dynamo
    optimizer.step()

assert estimate(job, gpu="a100-40gb", steps="all", mode="fake").capture.error is None
q = torch.randn(1, 1, 128, 16)
torch.testing.assert_close(torch.compile(flex_attention)(q, q, q), flex_attention(q, q, q))
print("compiled after the capture")
"""


def test_torch_compile_works_after_a_capture_in_the_same_process():
    """A fresh process (torch._dynamo not yet imported): the capture must not leave Dynamo's
    tables holding its stand-ins (torch.device)."""
    run = subprocess.run([sys.executable, "-c", _AFTER_A_CAPTURE], capture_output=True,
                         text=True, timeout=240, env={"PYTHONPATH": str(SRC),
                                                      "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "compiled after the capture" in run.stdout


SCRIPTS = Path(__file__).resolve().parent / "compile_scripts"
WIDTH, BATCH = 256, 64  # compile_scripts/_tiny.py
PARAMS = 2 * (WIDTH * WIDTH + WIDTH) * FP32
GRAPH_SCRIPTS = {"max_autotune": "max-autotune", "reduce_overhead_fullgraph": "reduce-overhead"}
COMPILED = {
    "nanogpt_compile": "Sequential", "max_autotune": "Sequential",
    "reduce_overhead_fullgraph": "Sequential", "dynamic_shapes": "Sequential",
    "compiled_loss_and_step": "loss_fn, opt_step", "dynamo_config_disable": "Head",
}


@pytest.mark.parametrize("script", sorted(COMPILED))
def test_compile_scripts_twice_in_one_process_with_hand_counted_bytes(script):
    """Public torch.compile patterns (see each script's docstring): the tiny model's parameters,
    gradients and AdamW moments are what they are in eager, and a second run in the same
    process gives the same estimate."""
    from peakmem.estimate import estimate_command

    peaks = []
    for _ in range(2):
        result = estimate_command(["python", str(SCRIPTS / f"{script}.py")], gpu="a100-40gb",
                                  steps="all", mode="fake", isolate=False)
        trace = result.capture.trace
        assert result.steps == 3
        assert sum(s for s, _ in allocations(trace, "parameter")) == PARAMS
        assert sum(s for s, _ in allocations(trace, "optimizer_state")) == 2 * PARAMS
        at_peak = result.breakdown.by_category
        assert at_peak["parameter"] == at_peak["gradient"] == PARAMS
        assert at_peak["optimizer_state"] == 2 * PARAMS
        # forward saves the input, the first layer's output and GELU's output each step
        saved = sum(s for s, _ in allocations(trace, "activation"))
        rows = [BATCH, BATCH, BATCH // 2 if script == "dynamic_shapes" else BATCH]
        assert saved >= sum(3 * n * WIDTH * FP32 for n in rows)
        assert result.peak_allocated_bytes >= 4 * PARAMS + BATCH * WIDTH * FP32
        notes = _compile_notes(result)
        assert len(notes) == 1 and f": {COMPILED[script]} ran eagerly;" in notes[0]
        graphs = GRAPH_SCRIPTS.get(script)
        assert (f"mode={graphs!r} also records CUDA graphs" in notes[0]) is (graphs is not None)
        assert ("cudagraph_trees" in notes[0]) is (graphs is not None)
        peaks.append(result.peak_reserved_bytes)
    assert peaks[0] == peaks[1]
    import torch._dynamo

    assert not torch._dynamo.config.suppress_errors  # the job's config tweaks were put back


def test_flex_attention_gym_script_compiled_at_module_level_twice():
    from peakmem.capture.compiled_code import FUSED_COMPILES
    from peakmem.estimate import estimate_command

    b, h, m, d = 2, 4, 512, 16  # compile_scripts/flex_gym_compiled.py
    peaks = []
    for _ in range(2):
        result = estimate_command(["python", str(SCRIPTS / "flex_gym_compiled.py")],
                                  gpu="a100-40gb", steps="all", mode="fake", isolate=False)
        trace = result.capture.trace
        assert result.steps == 3
        outputs = [s for s, tag in allocations(trace) if tag.op == "flex_attention"]
        assert outputs == [b * h * m * d * FP32, b * h * m * FP32, b * h * m * FP32] * 3
        dense = b * h * m * m  # a bool mask; the scores would be 4x that
        assert max(s for s, tag in allocations(trace) if tag.category != "workspace") < dense
        params = (h * d * 3 * h * d + 3 * h * d) * FP32
        assert sum(s for s, _ in allocations(trace, "optimizer_state")) == 2 * params
        assert FUSED_COMPILES["torch.nn.attention.flex_attention.create_block_mask"] in result.notes
        assert _compile_notes(result) == []  # the kernels are what the capture records
        peaks.append(result.peak_reserved_bytes)
    assert peaks[0] == peaks[1]


@torch.compile(fullgraph=True)
def _in_place_update(param: torch.Tensor, grad: torch.Tensor) -> None:
    """torchao's `single_param_adam` shape: elementwise math written back in place."""
    param.sub_((grad * 0.1).clamp(-1, 1) * 0.5)


class _CompiledUpdateSGD(torch.optim.Optimizer):
    def __init__(self, params) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    _in_place_update(param, param.grad)


def test_an_in_place_update_compiled_before_the_capture_drops_its_temporaries(a100, stack24):
    from peakmem.capture import fused_updates

    def job():
        model = torch.nn.Linear(256, 256).cuda()
        optimizer = _CompiledUpdateSGD(model.parameters())
        model(torch.randn(8, 256, device="cuda")).sum().backward()
        optimizer.step()

    result = capture_callable(job, gpu=a100, stack=stack24, steps="all")
    assert result.error is None, result.error_text
    assert fused_updates.NOTE in result.notes
    weight = 256 * 256 * FP32  # mul, clamp and mul made weight-sized temporaries eagerly
    temporaries = [s for s, tag in allocations(result.trace, phase="optimizer") if s == weight]
    assert temporaries == []


def test_code_compiled_in_one_capture_is_recorded_in_the_next(a100, stack24):
    """A module compiled during one capture and called in the next (a job's helper module
    imported once per process): the second capture names and marks it too."""
    compiled = {}

    def job():
        if "double" not in compiled:
            compiled["double"] = torch.compile(lambda x: x * 2)
        compiled["double"](torch.randn(1024, device="cuda"))

    for _ in range(2):
        result = capture_callable(job, gpu=a100, stack=stack24)
        assert result.error is None, result.error_text
        assert len(_compile_notes(result)) == 1 and "<lambda>" in _compile_notes(result)[0]
        assert [m for m in _marks(result.trace) if m.startswith("compiled region")] == [
            Mark.COMPILED.value, Mark.COMPILED_END.value]
    outside = compiled["double"](torch.ones(2))  # after the captures: plainly
    assert outside.tolist() == [2.0, 2.0]
