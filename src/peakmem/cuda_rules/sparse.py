"""Sparse (COO) matrix products on fake tensors: torch has no SparseMeta kernel for `mm` and
`addmm`, so a GCN's `torch.spmm(adj, x @ W)` (and its backward, `adj.t() @ grad`) stopped the
capture. On CUDA, cuSPARSE's SpMM returns a dense (rows x cols) matrix; its small buffer for
the sparse descriptors is not modelled.

A dense device tensor made sparse (`x.to_sparse()`, sentence-transformers' SparseEncoder.encode)
has as many entries as nonzero values, which fake tensors do not know: like `nonzero`
(cuda_rules/data_dependent.py) every value is taken to be nonzero, the upper bound: indices
(sparse_dim x n) int64 and values (n x the dense dims) of a coalesced COO tensor, n the product
of the sparse dims. Made CSR / CSC (`to_sparse_csr()`, `to_sparse(layout=torch.sparse_csr)`),
the same bound: compressed indices (batch dims x (rows or columns + 1)), plain indices and values
of rows x columns entries. A sparse tensor made dense again (`to_dense()`) is a dense tensor of
its shape (the same on CUDA whatever its entries); a CSR matrix times a dense one is a dense
product, as with COO."""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import (
    register_fused_kernel,
    register_sparse_compressed_kernel,
    register_sparse_kernel,
)


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


def _compressed_of_all_entries(self: torch.Tensor, layout: torch.layout,
                               dense_dim: int | None) -> torch.Tensor:
    """dense (batch..., rows, columns, dense...) -> CSR / CSC with every value an entry."""
    dense = dense_dim or 0
    batch = self.dim() - 2 - dense
    name = "to_sparse_csr" if layout == torch.sparse_csr else "to_sparse_csc"
    if batch < 0 or dense < 0:
        raise RuntimeError(f"{name}: a {self.dim()}-d tensor with dense_dim {dense} has no "
                           "two sparse dims")
    shape = list(self.shape)
    rows, columns = shape[batch], shape[batch + 1]
    compressed = (rows if layout == torch.sparse_csr else columns) + 1
    entries = rows * columns
    batch_shape, dense_shape = shape[:batch], shape[batch + 2:]
    device = self.device
    compressed_indices = torch.empty((*batch_shape, compressed), dtype=torch.long, device=device)
    plain_indices = torch.empty((*batch_shape, entries), dtype=torch.long, device=device)
    values = torch.empty((*batch_shape, entries, *dense_shape), dtype=self.dtype, device=device)
    return torch.ops.aten._sparse_compressed_tensor_unsafe(
        compressed_indices, plain_indices, values, shape, dtype=self.dtype, layout=layout,
        device=device)


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc)


@register_fused_kernel("_to_sparse")
def to_sparse(self: torch.Tensor, *, layout: torch.layout | None = None,
              blocksize: list[int] | None = None, dense_dim: int | None = None) -> torch.Tensor:
    """dense -> COO with every value an entry (`to_sparse()`, `to_sparse(layout=torch.sparse_coo)`),
    or CSR / CSC (`to_sparse(layout=torch.sparse_csr)`)."""
    if layout in _COMPRESSED and blocksize is None:
        return _compressed_of_all_entries(self, layout, dense_dim)
    if layout not in (None, torch.sparse_coo) or blocksize is not None:
        raise NotImplementedError(f"to_sparse(layout={layout}) on fake tensors")
    return _coo_of_all_entries(self, self.dim() - (dense_dim or 0))


@register_fused_kernel("_to_sparse_csr")
def to_sparse_csr(self: torch.Tensor, dense_dim: int | None = None) -> torch.Tensor:
    """dense -> CSR with every value an entry (`to_sparse_csr()`)."""
    return _compressed_of_all_entries(self, torch.sparse_csr, dense_dim)


@register_fused_kernel("_to_sparse_csc")
def to_sparse_csc(self: torch.Tensor, dense_dim: int | None = None) -> torch.Tensor:
    """dense -> CSC with every value an entry (`to_sparse_csc()`)."""
    return _compressed_of_all_entries(self, torch.sparse_csc, dense_dim)


@register_sparse_kernel("_to_dense")
def coo_to_dense(self: torch.Tensor, dtype: torch.dtype | None = None,
                 masked_grad: bool | None = None) -> torch.Tensor:
    """COO -> dense (`to_dense()`): a dense tensor of its shape."""
    return torch.empty(self.shape, dtype=dtype or self.dtype, device=self.device)


@register_sparse_compressed_kernel("addmm.out")
def compressed_addmm_out(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *,
                         beta: float = 1, alpha: float = 1, out: torch.Tensor) -> torch.Tensor:
    """input + CSR / CSC @ dense into `out` (n x k): torch's SparseCsrMeta `mm` and `addmm`
    (`csr @ x`, `torch.sparse.mm`) end here."""
    product = sparse_mm(mat1, mat2)
    torch.broadcast_shapes(self.shape, product.shape)
    return out.resize_(product.shape)


@register_fused_kernel("_to_sparse.sparse_dim")
def to_sparse_dim(self: torch.Tensor, sparse_dim: int) -> torch.Tensor:
    """dense -> COO over the first `sparse_dim` dims (`to_sparse(sparse_dim)`)."""
    return _coo_of_all_entries(self, sparse_dim)
