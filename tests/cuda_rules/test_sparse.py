"""Sparse COO products on fake tensors (cuda_rules/sparse.py): a GCN's `torch.spmm(adj, x @ W)`
used to stop fake mode ("aten::mm has no meta kernel"), and eager mode refuses sparse device
tensors, so such a job had no estimate at all."""

import pytest
import torch

from peakmem.capture import capture_callable
from tests.capture.capture_helpers import allocations

NODES, FEATURES, HIDDEN = 300, 40, 16


def _adjacency() -> torch.Tensor:
    index = torch.stack([torch.arange(NODES), torch.arange(NODES).roll(1)])
    return torch.sparse_coo_tensor(index, torch.ones(NODES), (NODES, NODES)).coalesce()


def test_sparse_mm_forward_and_backward_allocate_dense_products(a100, stack24):
    seen = {}

    def job():
        adj = _adjacency().to("cuda")
        weight = torch.nn.Parameter(torch.randn(FEATURES, HIDDEN, device="cuda"))
        x = torch.randn(NODES, FEATURES, device="cuda")
        out = torch.spmm(adj, x @ weight)
        both = torch.sparse.addmm(torch.zeros(1, HIDDEN, device="cuda"), adj, x @ weight)
        seen["shapes"] = (tuple(out.shape), out.layout, tuple(both.shape))
        (out.sum() + both.sum()).backward()
        seen["grad"] = tuple(weight.grad.shape)

    result = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert result.error is None, result.error_text
    assert seen["shapes"] == ((NODES, HIDDEN), torch.strided, (NODES, HIDDEN))
    assert seen["grad"] == (FEATURES, HIDDEN)
    dense = NODES * HIDDEN * 4
    # forward: spmm, addmm; backward: adj.t() @ grad for each
    assert [size for size, _ in allocations(result.trace, op="mm")].count(dense) >= 2
    assert [size for size, _ in allocations(result.trace, op="_sparse_addmm")] == [dense]


def test_sparse_mm_checks_shapes(a100, stack24):
    def job():
        adj = _adjacency().to("cuda")
        torch.spmm(adj, torch.randn(NODES + 1, 4, device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert result.error is not None
    with pytest.raises(RuntimeError):
        from peakmem.cuda_rules.sparse import sparse_mm
        sparse_mm(torch.empty(3, 3).to_sparse(), torch.empty(4, 2))


@pytest.mark.parametrize("move", ["to", "cuda"])
def test_a_sparse_tensor_moved_to_the_device_keeps_its_entries(a100, stack24, move):
    seen = {}

    def job():
        adj = _adjacency()
        moved = adj.to("cuda") if move == "to" else adj.cuda()
        seen["nnz"] = moved._nnz()
        seen["indices"] = tuple(moved._indices().shape)

    result = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert result.error is None, result.error_text
    # torch's sparse to("meta") keeps the shape but drops the entries (nnz 0): the adjacency
    # took no device memory before
    assert seen == {"nnz": NODES, "indices": (2, NODES)}
    moved = sorted(size for size, tag in allocations(result.trace) if tag.category == "input")
    assert moved == [NODES * 4, 2 * NODES * 8]  # values (fp32), indices (int64)


def test_to_sparse_of_a_device_tensor_counts_every_value_and_reads_back_on_the_host(a100, stack24):
    """`x.to_sparse()` of a dense device tensor (sentence-transformers' SparseEncoder.encode:
    SPLADE vectors made sparse, then `.cpu()`): aten::_to_sparse had no meta kernel, and the
    sparse result could not be read back. The entries are bounded as `nonzero` is (every
    value an entry); the host copy has as many, and host ops on it run."""
    seen = {}

    def job():
        dense = torch.relu(torch.randn(4, 300, device="cuda"))
        coo = dense.to_sparse()
        rows = dense.view(4, 3, 100).to_sparse(2)  # sparse over (4, 3), dense rows of 100
        seen["coo"] = (coo.layout, coo.device.type, tuple(coo._indices().shape), coo._nnz())
        seen["rows"] = (tuple(rows._indices().shape), tuple(rows._values().shape))
        host = coo.cpu()
        seen["host"] = (host.layout, host.device.type, host._nnz(),
                        tuple(torch.stack(list(host)).shape))

    result = capture_callable(job, gpu=a100, stack=stack24, mode="fake")
    assert result.error is None, result.error_text
    assert seen["coo"] == (torch.sparse_coo, "cuda", (2, 1200), 1200)
    assert seen["rows"] == ((2, 12), (12, 100))
    assert seen["host"] == (torch.sparse_coo, "cpu", 1200, (4, 300))
    # an assumption the estimate states: data-dependent sizes bounded from above
    assert result.data_dependent == {"aten::_to_sparse": 2}
    made = sorted(size for size, _ in allocations(result.trace, op="_to_sparse"))
    # values (fp32) and indices (int64) of each: 1,200 entries, then 12 rows of 100
    assert made == sorted([1200 * 4, 2 * 1200 * 8, 12 * 100 * 4, 2 * 12 * 8]), made
