"""`index_put(accumulate=True)` on CUDA (cuda_rules/indexing.py, Indexing.cu
`index_put_with_sort_kernel`): the backward of advanced indexing."""

import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations


def pairwise_backward(a100, stack24, batch, features):
    """DLRM's interaction: the upper triangle of a batched Gram matrix, picked by advanced
    indexing, then concatenated (so its gradient is a strided slice of cat's gradient)."""

    def job():
        x = torch.randn(batch, features, 16, device="cuda", requires_grad=True)
        rows, cols = torch.triu_indices(features, features, 1).cuda()
        dots = torch.bmm(x, x.transpose(1, 2))[:, rows, cols]
        torch.cat([x[:, 0], dots], dim=1).sum().backward()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    return [(size, tag.op) for size, tag in allocations(result.trace, phase="backward")]


def test_index_backward_sorts_and_copies_the_sliced_gradient(a100, stack24):
    batch, features = 256, 8
    n = features * (features - 1) // 2  # the broadcast index shape: one pair per entry
    backward = pairwise_backward(a100, stack24, batch, features)
    scratch = [size for size, op in backward if op == "index_put_accumulate[scratch]"]
    # per index tensor: remainder + (x stride) (the first product becomes linearIndex);
    # expandedValue = the [batch, n] fp32 gradient slice made contiguous; sorted, orig, range
    assert scratch == [8 * n] * 4 + [batch * n * 4] + [8 * n] * 3
    assert (2 * 8 * n, "cub_radix_sort_temp") in backward
    # replayed in place into the zeros (no output of its own), as CUDA writes it
    assert "index_put.default" not in [op for _, op in backward]
