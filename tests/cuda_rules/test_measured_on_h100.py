"""Rules found by diffing real allocator snapshots (H100, torch 2.11; benchmarks/gpu_session.sh)
against the capture's trace of the same jobs (benchmarks/groundtruth/h100-80gb.csv)."""

import torch

from peakmem.capture import capture_callable
from peakmem.cuda_rules.composite_compliance import linear_adds_bias_in_place
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations


def mlp_step():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
    model(torch.randn(8, 16, device="cuda")).sum().backward()


def test_torch_2_11_keeps_one_cublaslt_workspace_per_thread_that_ran_lt():
    h100 = load_gpu("h100-80gb")
    result = capture_callable(mlp_step, gpu=h100, stack=load_stack("2.11.0"))
    lt = [(size, tag.phase) for size, tag in allocations(result.trace, "workspace", op="cublaslt")]
    # two Lt addmm calls in forward, one persistent 1 MiB workspace; backward runs only mm
    assert lt == [(1048576, "forward")]
    freed = {ident for kind, ident, *_ in result.trace.events() if kind == 1}
    allocs = [(ident, result.trace.tag_of(i)) for i, (kind, ident, *_) in enumerate(result.trace.events())
              if kind == 0]
    lt_ids = [ident for ident, tag in allocs if tag and (tag.op or "").startswith("cublaslt")]
    assert lt_ids and not set(lt_ids) & freed
    older = capture_callable(mlp_step, gpu=h100, stack=load_stack("2.6.0"))
    assert allocations(older.trace, "workspace", op="cublaslt") == []


def linear_ops(x_shape, transpose: bool):
    """The aten ops that allocate in forward for one biased Linear on a (maybe transposed) input."""

    def job():
        layer = torch.nn.Linear(32, 96).cuda()
        x = torch.randn(*x_shape, device="cuda")
        layer(x.transpose(0, 1) if transpose else x)

    result = capture_callable(job, gpu=load_gpu("h100-80gb"), stack=load_stack("2.11.0"))
    assert result.error is None, result.error_text
    return [(size, tag.op) for size, tag in allocations(result.trace, phase="forward")
            if tag.category != "workspace"][-3:]


def test_linear_on_a_transposed_input_adds_the_bias_in_place():
    # ATen linear: matmul (the input folded by a copy, then mm) and `output.add_(bias)`: no
    # out-of-place add of the output's size (the capture's dispatch mode makes ATen think every
    # tensor is a subclass, which would pick `at::add`)
    ops = linear_ops((4, 8, 32), transpose=True)
    assert [op for _, op in ops][-2:] == ["clone.default", "mm.default"]
    assert ops[-1][0] == 8 * 4 * 96 * 4
    assert linear_adds_bias_in_place(torch.empty(8, 4, 32, device="meta").transpose(0, 1),
                                     torch.empty(96, device="meta"))


def test_linear_on_a_contiguous_input_stays_one_addmm():
    ops = linear_ops((4, 8, 32), transpose=False)
    assert ops[-1] == (4 * 8 * 96 * 4, "addmm.default")
    assert not linear_adds_bias_in_place(torch.empty(4, 8, 32, device="meta"), torch.empty(96, device="meta"))
    assert not linear_adds_bias_in_place(torch.empty(8, 32, device="meta").t().t(), None)
