import pytest
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def embedding_backward(a100, stack24, indices_shape, scale=False):
    def job():
        table = torch.nn.Embedding(1000, 64, scale_grad_by_freq=scale).cuda()
        table(torch.randint(0, 1000, indices_shape).cuda()).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    return [(size, tag.op) for size, tag in allocations(result.trace, phase="backward")]


def test_few_indices_take_the_direct_kernel(a100, stack24):
    backward = embedding_backward(a100, stack24, (4, 512))  # 2048 <= 3072 indices
    assert [op for _, op in backward if "embedding" in op] == ["embedding_dense_backward.default"]


@pytest.mark.parametrize("scale", [False, True])
def test_many_indices_sort_and_segment_around_the_gradient(a100, stack24, scale):
    n = 8 * 512  # int64 indices
    backward = embedding_backward(a100, stack24, (8, 512), scale)
    ops = [op for _, op in backward]
    output_at = ops.index("embedding_dense_backward.default")
    before, after = backward[:output_at], backward[output_at + 1 :]
    assert [size for size, op in before if op.endswith("[scratch]")] == [8 * n] * (4 if scale else 3)
    assert (2 * 8 * n, "cub_radix_sort_temp") in before
    # EmbeddingBackwardKernel.cu `embedding_backward_cuda_kernel`: max_segments = min(n, 1000)
    # and max_partial_segment = n / 10 + max_segments bound the segment buffers
    segments, partials = 1000, n // 10 + 1000
    assert [size for size, op in after if op.endswith("[scratch]")] == [
        8 * n, 8, 8 * segments, 8 * segments, 8, 8 * partials, partials * 64 * 4,
    ]


def bag_backward(a100, stack24, bags, tables, mode="sum"):
    """DLRM's pattern: bag tables stacked with a dense feature, so each table's gradient is a
    strided slice of the stack's gradient."""

    def job():
        embeddings = [torch.nn.EmbeddingBag(1000, 64, mode=mode).cuda() for _ in range(tables)]
        dense = torch.randn(bags, 64, device="cuda", requires_grad=True)
        indices = torch.randint(0, 1000, (bags * 4,)).cuda()
        offsets = torch.arange(0, bags * 4, 4).cuda()
        stacked = torch.stack([dense, *(e(indices, offsets) for e in embeddings)], dim=1)
        stacked.sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    return [(size, tag.op) for size, tag in allocations(result.trace, phase="backward")]


def test_embedding_bag_backward_copies_its_gradient_then_sorts_and_segments(a100, stack24):
    bags = 512
    n = 4 * bags  # int64 indices; EmbeddingBag has no direct kernel, even below 3072 indices
    backward = bag_backward(a100, stack24, bags, tables=1)
    ops = [op for _, op in backward]
    output_at = ops.index("_embedding_bag_backward.default")
    before, after = backward[:output_at], backward[output_at + 1 :]
    # `grad_.contiguous()` (a [bags, 64] fp32 slice of the stack's gradient), then the sort's
    # sorted_indices, orig_indices, range
    assert [size for size, op in before if op == "_embedding_bag_backward[scratch]"] == [
        bags * 64 * 4, 8 * n, 8 * n, 8 * n,
    ]
    assert (2 * 8 * n, "cub_radix_sort_temp") in before
    segments, partials = 1000, n // 10 + 1000
    assert [size for size, op in after if op.endswith("[scratch]")] == [
        8 * n, 8, 8 * segments, 8 * segments, 8, 8 * partials, partials * 64 * 4,
    ]


def test_embedding_bag_backward_in_max_mode_scatters_without_scratch(a100, stack24):
    backward = bag_backward(a100, stack24, 512, tables=1, mode="max")
    assert not [op for _, op in backward if op.endswith("[scratch]") or op.startswith("cub")]
