"""Autograd's gradient accumulation replayed as CUDA does it (capture/grad_accumulation.py):
in place when the engine's buffer holds the only reference and grad mode is off."""

import torch

from peakmem.capture import capture_callable
from peakmem.capture.grad_accumulation import between_nodes, engine_marked, graph_nodes
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations

N = 64 * 256 * 4  # bytes of one (64, 256) fp32 gradient


def residual_job(create_graph: bool = False):
    def job():
        lin = torch.nn.Linear(256, 256).cuda()
        x = torch.randn(64, 256, device="cuda")
        h = lin(x)
        loss = (h * 3 + h.relu() * 2).sum()  # h gets two dense gradients: the engine sums them
        loss.backward(create_graph=create_graph)

    return capture_callable(job, gpu=load_gpu("h100-80gb"), stack=load_stack("2.11.0"))


def test_the_engine_sums_a_residual_gradient_in_place():
    result = residual_job()
    assert result.error is None, result.error_text
    sums = [size for size, tag in allocations(result.trace, phase="backward") if tag.op == "add.Tensor"]
    assert sums == []  # the CUDA engine adds into the first gradient's block


def test_with_create_graph_the_sum_is_out_of_place():
    result = residual_job(create_graph=True)
    assert result.error is None, result.error_text
    sums = [size for size, tag in allocations(result.trace, phase="backward") if tag.op == "add.Tensor"]
    assert sums == [N]  # grad mode on: `old_var + var` (input_buffer.cpp)


def test_the_engine_is_marked_between_nodes_only():
    seen = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((func.__name__, between_nodes()))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 4, device="meta", requires_grad=True)
    h = x * 3
    loss = (h * 2 + h.relu()).sum()
    assert len(graph_nodes([loss.grad_fn])) >= 5
    with engine_marked([loss.grad_fn]), Spy():
        loss.backward()
    assert ("add.Tensor", True) in seen  # the accumulation
    # the engine's own root gradient is made before any node; every node's work is inside one
    assert seen[0] == ("ones_like.default", True)
    assert all(not between for name, between in seen[1:] if name != "add.Tensor")
    assert not between_nodes()  # the mark is gone after the call


def test_an_expanded_first_gradient_is_summed_out_of_place():
    # `h + ...`: h's first gradient is the loss's expanded ones (stride 0: overlapping), which
    # `can_accumulate_inplace` refuses on CUDA too
    def job():
        lin = torch.nn.Linear(256, 256).cuda()
        h = lin(torch.randn(64, 256, device="cuda"))
        (h + h.relu() * 2).sum().backward()

    result = capture_callable(job, gpu=load_gpu("h100-80gb"), stack=load_stack("2.11.0"))
    sums = [size for size, tag in allocations(result.trace, phase="backward") if tag.op == "add.Tensor"]
    assert sums == [N]


def test_a_parameter_used_twice_keeps_its_sum_out_of_place():
    # tied weights (one Parameter, two uses): its two gradients are summed out of place, as the
    # H100 runs of GPT-2 / BERT / T5 / Llama 3.2 1B measured (grad_accumulation.py)
    def job():
        weight = torch.nn.Parameter(torch.randn(512, 256, device="cuda"))
        x = torch.randn(64, 256, device="cuda")
        ((x @ weight.t()) * 3 + (x @ weight.t()).relu()).sum().backward()

    result = capture_callable(job, gpu=load_gpu("h100-80gb"), stack=load_stack("2.11.0"))
    assert result.error is None, result.error_text
    sums = [size for size, tag in allocations(result.trace, phase="backward") if tag.op == "add.Tensor"]
    assert sums == [512 * 256 * 4]
