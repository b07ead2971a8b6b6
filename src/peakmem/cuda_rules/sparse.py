"""Sparse (COO) matrix products on fake tensors: torch has no SparseMeta kernel for `mm` and
`addmm`, so a GCN's `torch.spmm(adj, x @ W)` (and its backward, `adj.t() @ grad`) stopped the
capture. On CUDA, cuSPARSE's SpMM returns a dense (rows x cols) matrix; its small buffer for
the sparse descriptors is not modelled.

A dense device tensor made sparse (`x.to_sparse()`, sentence-transformers' SparseEncoder.encode)
has as many entries as nonzero values, which fake tensors do not know: like `nonzero`
(cuda_rules/data_dependent.py) every value is taken to be nonzero, the upper bound: indices
(sparse_dim x n) int64 and values (n x the dense dims) of a coalesced COO tensor, n the product
of the sparse dims."""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import register_fused_kernel, register_sparse_kernel


def _dense_product(rows: int, other: torch.Tensor) -> torch.Tensor:
    return torch.empty((rows, other.shape[1]), dtype=other.dtype, device=other.device)


@register_sparse_kernel("mm")
def sparse_mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """sparse (n x m) @ dense (m x k) -> dense (n x k)."""
    if self.dim() != 2 or mat2.dim() != 2 or self.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mm: shapes {tuple(self.shape)} and {tuple(mat2.shape)} cannot be multiplied")
    if mat2.layout != torch.strided:
        raise NotImplementedError("sparse @ sparse on fake tensors")
    return _dense_product(self.shape[0], mat2)


@register_sparse_kernel("addmm")
def sparse_addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *,
                 beta: float = 1, alpha: float = 1) -> torch.Tensor:
    """input + sparse @ dense -> dense (n x k)."""
    product = sparse_mm(mat1, mat2)
    torch.broadcast_shapes(self.shape, product.shape)
    return product


def _coo_of_all_entries(self: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    if not 0 < sparse_dim <= self.dim():
        raise RuntimeError(f"to_sparse: sparse_dim {sparse_dim} of a {self.dim()}-d tensor")
    entries = 1
    for size in self.shape[:sparse_dim]:
        entries *= size
    indices = torch.empty((sparse_dim, entries), dtype=torch.long, device=self.device)
    values = torch.empty((entries, *self.shape[sparse_dim:]), dtype=self.dtype, device=self.device)
    return torch.ops.aten._sparse_coo_tensor_with_dims_and_tensors(
        sparse_dim, self.dim() - sparse_dim, list(self.shape), indices, values, dtype=self.dtype,
        layout=torch.sparse_coo, device=self.device, is_coalesced=True)


@register_fused_kernel("_to_sparse")
def to_sparse(self: torch.Tensor, *, layout: torch.layout | None = None,
              blocksize: list[int] | None = None, dense_dim: int | None = None) -> torch.Tensor:
    """dense -> COO with every value an entry (`to_sparse()`, `to_sparse(layout=torch.sparse_coo)`)."""
    if layout not in (None, torch.sparse_coo) or blocksize is not None:
        raise NotImplementedError(f"to_sparse(layout={layout}) on fake tensors")
    return _coo_of_all_entries(self, self.dim() - (dense_dim or 0))


@register_fused_kernel("_to_sparse.sparse_dim")
def to_sparse_dim(self: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """dense -> COO over the first `sparse_dim` dims (`to_sparse(sparse_dim)`)."""
    return _coo_of_all_entries(self, sparse_dim)
