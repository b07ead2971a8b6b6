"""Stack-specific saved inputs: torch 1.10's softmax / log_softmax kept their input for backward
(pytorch/pytorch#64000, fixed by #65242 in 1.11); the torch-1.10 stack profile holds it."""

import pytest
import torch

from peakmem.allocator.simulate import simulate
from peakmem.capture import capture_callable
from peakmem.cuda_rules import COMPOSITE_RULES
from peakmem.profiles import load_gpu, load_stack
from peakmem.trace.events import EventKind

SHAPE = (8, 256, 256)
INPUT_BYTES = 8 * 256 * 256 * 4


def _softmax_job(fn, grad: bool = True):
    def job():
        x = torch.randn(*SHAPE, device="cuda", requires_grad=grad)
        scores = x * 2  # the softmax input: only softmax can keep it alive
        probs = fn(scores, dim=-1)
        del scores
        out = probs * 3  # a scalar mul saves nothing: probs lives only as softmax's output
        del probs
        if grad:
            out.sum().backward()
        torch.empty(MARKER_ELEMENTS, device="cuda")

    return job


def _run(job, version: str):
    result = capture_callable(job, gpu=load_gpu("v100-32gb"), stack=load_stack(version))
    assert result.error is None
    return result.trace, simulate(result.trace, torch_version=version)


MARKER_ELEMENTS = 777


def _live_at_marker(trace) -> int:
    """Bytes live when the job allocated its marker (a tensor of MARKER_ELEMENTS floats)."""
    live = {}
    for kind, ident, size, _stream, _tag in trace.events():
        if kind == EventKind.ALLOC and size == MARKER_ELEMENTS * 4:
            return sum(live.values())
        if kind == EventKind.ALLOC:
            live[ident] = size
        elif kind == EventKind.FREE:
            live.pop(ident, None)
    raise AssertionError("the job allocated no marker")


@pytest.mark.parametrize("fn", [torch.softmax, torch.log_softmax])
def test_torch_1_10_keeps_the_softmax_input_until_its_backward(fn):
    trace_new, new = _run(_softmax_job(fn), "2.4")
    trace_old, old = _run(_softmax_job(fn), "1.10")
    # the held input is live at the peak (backward of the product) on 1.10 only
    assert old.peak_allocated_bytes - new.peak_allocated_bytes == INPUT_BYTES
    # and released once the node ran: after backward both stacks hold the same memory
    assert _live_at_marker(trace_old) == _live_at_marker(trace_new)


def test_no_grad_softmax_holds_nothing():
    _, new = _run(_softmax_job(torch.softmax, grad=False), "2.4")
    _, old = _run(_softmax_job(torch.softmax, grad=False), "1.10")
    assert old.peak_allocated_bytes == new.peak_allocated_bytes


def test_graph_dropped_without_backward_frees_the_held_input():
    def job():
        x = torch.randn(*SHAPE, device="cuda", requires_grad=True)
        probs = torch.softmax(x * 2, dim=-1)
        del probs  # the graph dies with its output; the held input with it
        torch.empty(MARKER_ELEMENTS, device="cuda")

    trace, _ = _run(job, "1.10")
    assert _live_at_marker(trace) == INPUT_BYTES  # only x


def test_every_saved_input_entry_names_a_composite_rule_and_a_source():
    for version in ("1.10", "2.4", "2.5", "2.6"):
        stack = load_stack(version)
        for op_name, entry in stack.saved_inputs.items():
            assert op_name in COMPOSITE_RULES, op_name
            assert not entry.assumed and "pytorch/pytorch#" in entry.source
    assert set(load_stack("1.10").saved_inputs) == {"softmax.int", "log_softmax.int"}
    assert not load_stack("2.4").saved_inputs


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_softmax_holds_its_input_only_while_its_region_is_recomputed(reentrant):
    """Under activation checkpointing the held input goes through the checkpoint like any saved
    tensor: nothing is held across the forward of several regions."""
    from torch.utils.checkpoint import checkpoint

    def region(x):
        return torch.softmax(x * 2, dim=-1) * 3

    def job():
        x = torch.randn(*SHAPE, device="cuda", requires_grad=True)
        h = x
        for _ in range(4):
            h = checkpoint(region, h, use_reentrant=reentrant)
        torch.empty(MARKER_ELEMENTS, device="cuda")  # after the forward of the 4 regions
        h.sum().backward()

    trace_new, new = _run(job, "2.4")
    trace_old, old = _run(job, "1.10")
    assert _live_at_marker(trace_old) == _live_at_marker(trace_new)
    # in backward one region at a time holds it: at most one input more at the peak
    assert 0 <= old.peak_allocated_bytes - new.peak_allocated_bytes <= INPUT_BYTES


def test_the_estimate_applies_the_rules_of_the_torch_it_is_asked_for():
    from peakmem.estimate import estimate

    job = _softmax_job(torch.softmax)
    old = estimate(job, gpu="v100-32gb", torch_version="1.10.2", mode="fake")
    new = estimate(job, gpu="v100-32gb", torch_version="2.4.1", mode="fake")
    assert old.peak_allocated_bytes - new.peak_allocated_bytes == INPUT_BYTES


def test_torch_1_10_gives_cublas_no_workspace_from_the_caching_allocator():
    """pytorch/pytorch#83461 (torch 1.13) first set cuBLAS handles' workspace from the caching
    allocator: on 2.4 a matmul adds the 8519680-byte default workspace, on 1.10 nothing."""

    def job():
        a = torch.randn(256, 256, device="cuda")
        a @ a

    _, new = _run(job, "2.4")
    _, old = _run(job, "1.10")
    assert load_stack("2.4").cublas_workspace_for((7, 0)).value == 8519680
    assert new.peak_allocated_bytes - old.peak_allocated_bytes == 8519680
