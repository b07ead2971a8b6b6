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
