"""ATen's composite-compliant branches replayed as CUDA runs them (capture/in_place_branches.py).

Each expectation is worked out from the C++ source: what the plain-tensor branch allocates on
CUDA, against what the capture sees (isTensorSubclassLike is true under its dispatch mode)."""

import pytest
import torch
import torch.nn.functional as F

import peakmem.capture.recorder as recorder
from peakmem.capture import capture_callable
from peakmem.capture.grad_accumulation import current_node, engine_marked
from peakmem.capture.in_place_branches import iter_branches
from peakmem.cuda_rules.composite_compliance import SDPA_MATH
from peakmem.profiles import load_gpu, load_stack
from tests.capture.capture_helpers import allocations


def capture(job):
    result = capture_callable(job, gpu=load_gpu("h100-80gb"), stack=load_stack("2.11.0"))
    assert result.error is None, result.error_text
    return result


def backward_ops(result) -> list[tuple[str, int]]:
    found = allocations(result.trace, phase="backward")
    return [(tag.op.split(".")[0], size) for size, tag in found]


@pytest.fixture
def out_of_place(monkeypatch):
    """The capture as it was before the branches were ruled: ATen's out-of-place steps kept."""
    monkeypatch.setattr(recorder, "in_place_branch", lambda *args: None)


ROWS, COLS = 64, 1000
N = ROWS * COLS * 4  # one (64, 1000) fp32 tensor


def gather_job(create_graph: bool = False):
    def job():
        x = torch.randn(ROWS, COLS, device="cuda", requires_grad=True)
        index = torch.randint(0, COLS, (ROWS, 1), device="cuda")
        x.gather(1, index).sum().backward(create_graph=create_graph)

    return job


def test_gather_backward_scatters_into_its_zeros():
    # gather_backward: result = grad.new_zeros(self.sizes()); result.scatter_add_(dim, index, grad)
    assert backward_ops(capture(gather_job())) == [("ones_like", 4), ("new_zeros", N)]


def test_gather_backward_out_of_place_without_the_rule(out_of_place):
    # the subclass branch: return result.scatter_add(dim, index, grad)
    assert backward_ops(capture(gather_job())) == [
        ("ones_like", 4), ("new_zeros", N), ("scatter_add", N),
    ]


def test_gather_backward_is_in_place_with_create_graph_too():
    # gather_backward's condition has no GradMode term: scatter_add_ also under create_graph
    # (AccumulateGrad then copies the gradient, as on CUDA: grad mode is on)
    assert backward_ops(capture(gather_job(create_graph=True))) == [
        ("ones_like", 4), ("new_zeros", N), ("new_empty_strided", N),
    ]


def test_a_scatter_add_outside_gather_backward_stays_out_of_place():
    def job():
        zeros = torch.zeros(ROWS, COLS, device="cuda")
        index = torch.randint(0, COLS, (ROWS, 1), device="cuda")
        summed = zeros.scatter_add(1, index, torch.ones(ROWS, 1, device="cuda"))
        del zeros  # the job's own out-of-place op: CUDA allocates its result too
        summed.sum()

    found = allocations(capture(job).trace, op="scatter_add")
    sizes = [size for size, _tag in found]
    assert sizes == [N]


def index_job():
    x = torch.randn(1000, 256, device="cuda", requires_grad=True)
    rows = torch.randint(0, 1000, (64,), device="cuda")
    x[rows].sum().backward()


def without_sort_scratch(ops: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The sort's scratch of index_put(accumulate=True) (tests/cuda_rules/test_indexing.py)."""
    return [(op, size) for op, size in ops
            if op != "index_put_accumulate[scratch]" and op != "cub_radix_sort_temp"]


def test_index_backward_puts_into_its_zeros():
    # index_backward: _index_put_impl_(zeros_like_self, indices, grad, accumulate=true, unsafe=true)
    assert without_sort_scratch(backward_ops(capture(index_job))) == [
        ("ones_like", 4), ("new_zeros", 1000 * 256 * 4),
    ]


def test_index_backward_out_of_place_without_the_rule(out_of_place):
    # the subclass branch: zeros_like_self.index_put(indices, grad, true)
    assert without_sort_scratch(backward_ops(capture(index_job))) == [
        ("ones_like", 4), ("new_zeros", 1000 * 256 * 4), ("index_put", 1000 * 256 * 4),
    ]


def index_select_job():
    x = torch.randn(1000, 256, device="cuda", requires_grad=True)
    x.index_select(0, torch.randint(0, 1000, (64,), device="cuda")).sum().backward()


def test_index_select_backward_adds_into_its_zeros():
    # index_select_backward_symint: grad.new_zeros(self_sizes).index_add_(dim, index, grad)
    assert backward_ops(capture(index_select_job)) == [
        ("ones_like", 4), ("new_zeros", 1000 * 256 * 4),
    ]


def test_index_select_backward_out_of_place_without_the_rule(out_of_place):
    # isTensorSubclassLike(index): grad.new_zeros(self_sizes).index_add(dim, index, grad)
    assert backward_ops(capture(index_select_job)) == [
        ("ones_like", 4), ("new_zeros", 1000 * 256 * 4), ("index_add", 1000 * 256 * 4),
    ]


def test_masked_select_backward_scatters_into_its_zeros():
    def job():
        x = torch.randn(1000, 256, device="cuda", requires_grad=True)
        x.masked_select(torch.rand(1000, 256, device="cuda") > 0.5).sum().backward()

    # masked_select has no meta kernel: eager mode (real values, same recorder)
    result = capture_callable(job, gpu=load_gpu("h100-80gb"), stack=load_stack("2.11.0"),
                              mode="eager")
    assert result.error is None, result.error_text
    # masked_select_backward: result = zeros_like(input); result.masked_scatter_(mask, grad)
    assert backward_ops(result) == [("ones_like", 4), ("zeros_like", 1000 * 256 * 4)]


def test_take_backward_puts_into_its_zeros():
    def job():
        x = torch.randn(ROWS, COLS, device="cuda", requires_grad=True)
        torch.take(x, torch.randint(0, ROWS * COLS, (128,), device="cuda")).sum().backward()

    # take_backward: zeros_like(self).put_(indices, grad, true); else .put(...)
    assert backward_ops(capture(job)) == [("ones_like", 4), ("zeros_like", N)]


def bce_job(create_graph: bool = False, pos_weight: bool = False):
    def job():
        x = torch.randn(ROWS, COLS, device="cuda", requires_grad=True)
        target = torch.rand(ROWS, COLS, device="cuda")
        weight = torch.rand(COLS, device="cuda")
        extra = {"pos_weight": torch.rand(COLS, device="cuda")} if pos_weight else {}
        loss = F.binary_cross_entropy_with_logits(x, target, weight=weight, **extra)
        loss.backward(create_graph=create_graph)

    return job


def test_bce_with_logits_backward_works_in_the_sigmoid():
    # input.sigmoid().sub_(target); grad_input.mul_(grad); grad_input.mul_(weight); .div_(numel)
    assert backward_ops(capture(bce_job())) == [("ones_like", 4), ("sigmoid", N)]


def test_bce_with_logits_backward_with_create_graph_is_out_of_place():
    # `areAnyTensorSubclassLike({input, target}) || at::GradMode::is_enabled()`: out of place
    assert backward_ops(capture(bce_job(create_graph=True))) == [
        ("ones_like", 4), ("sigmoid", N), ("sub", N), ("mul", N), ("mul", N),
        ("new_empty_strided", N),  # AccumulateGrad's copy under create_graph
    ]


def test_bce_with_logits_pos_weight_chain_is_replayed_at_its_end_only():
    # t = pos_weight.mul(target); t.add(1).sub_(target).mul_(input.sigmoid()).sub_(t): CUDA
    # allocates t, t.add(1) and the sigmoid. The chain's temporaries live to the end of the
    # expression, so only its last step (`.sub(t)`, whose operand dies right after) is
    # replayed; `.sub(target)` and `.mul(sigmoid)` stay: two input-sized tensors too many
    assert backward_ops(capture(bce_job(pos_weight=True))) == [
        ("ones_like", 4), ("mul", N), ("add", N), ("sub", N), ("sigmoid", N), ("mul", N),
    ]


HEADS, LENGTH = 4, 128
SCORES = 2 * HEADS * LENGTH * LENGTH * 4  # one (2, 4, 128, 128) fp32 score matrix


def sdpa_job(head_dim: int, mask_kind: str = "float"):
    def job():
        q = torch.randn(2, HEADS, LENGTH, head_dim, device="cuda", requires_grad=True)
        if mask_kind == "causal":  # the math path builds ones(L, S).tril() and converts it
            F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            return
        mask = (torch.rand(LENGTH, LENGTH, device="cuda") > 0.5 if mask_kind == "bool"
                else torch.randn(2, HEADS, LENGTH, LENGTH, device="cuda"))
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask).sum().backward()

    return job


def forward_adds(result) -> list[int]:
    found = allocations(result.trace, op="add.Tensor")
    return [size for size, tag in found if tag.phase != "backward"]


@pytest.mark.parametrize("mask_kind", ["float", "bool", "causal"])
def test_sdpa_math_adds_the_mask_in_place(mask_kind):
    # head dim 63 (not a multiple of 4): neither fused backend, the math path's attn.add_(mask)
    assert forward_adds(capture(sdpa_job(63, mask_kind))) == []


@pytest.mark.parametrize("mask_kind", ["float", "bool", "causal"])
def test_sdpa_math_adds_the_mask_out_of_place_without_the_rule(out_of_place, mask_kind):
    # the subclass branch: attn = attn.add(*attn_mask), a second score matrix
    assert forward_adds(capture(sdpa_job(63, mask_kind))) == [SCORES]


def test_a_fused_sdpa_backend_has_no_mask_add():
    # head dim 64: memory-efficient attention takes the mask as its bias, no add at all
    assert forward_adds(capture(sdpa_job(64))) == []


def test_the_running_node_is_named():
    seen = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append((func.__name__, current_node()))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 8, device="meta", requires_grad=True)
    loss = (x.gather(1, torch.zeros(4, 1, dtype=torch.long, device="meta")) * 3).sum()
    with engine_marked([loss.grad_fn]), Spy():
        loss.backward()
    assert ("scatter_add.default", "GatherBackward0") in seen
    assert ("mul.Tensor", "MulBackward0") in seen
    assert seen[0] == ("ones_like.default", None)  # the engine's own work, between nodes
    assert current_node() is None


def test_every_branch_names_a_real_autograd_node_or_a_marked_composite():
    places = {branch.where for branch in iter_branches()}
    nodes = places - {SDPA_MATH}
    assert nodes == {"GatherBackward0", "IndexBackward0", "IndexSelectBackward0",
                     "MaskedSelectBackward0", "TakeBackward0",
                     "BinaryCrossEntropyWithLogitsBackward0"}
    for name in nodes:  # a node renamed in a later torch would silently stop matching
        assert hasattr(torch._C._functions, name), name


# -- end to end -------------------------------------------------------------------------------
BATCH, ACTIONS = 2048, 8192


def dqn_train():
    """A DQN-style update: `q = net(obs).gather(1, actions)`, its backward starts at the peak."""
    net = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, ACTIONS)
    ).cuda()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(2):
        obs = torch.randn(BATCH, 32, device="cuda")
        actions = torch.randint(0, ACTIONS, (BATCH, 1), device="cuda")
        q = net(obs).gather(1, actions).squeeze(1)
        loss = F.smooth_l1_loss(q, torch.randn(BATCH, device="cuda"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_a_dqn_update_is_estimated_one_q_table_lower(monkeypatch):
    from peakmem.estimate import estimate

    ruled = estimate(dqn_train, gpu="h100-80gb", steps="all")
    monkeypatch.setattr(recorder, "in_place_branch", lambda *args: None)
    before = estimate(dqn_train, gpu="h100-80gb", steps="all")
    q_table = BATCH * ACTIONS * 4  # the (batch, actions) fp32 scatter_add result
    assert before.peak_bytes - ruled.peak_bytes == q_table  # one block fewer reserved
    # the most allocated at once comes later, at the output layer's bias-gradient reduction
    assert before.peak_allocated_bytes == ruled.peak_allocated_bytes
