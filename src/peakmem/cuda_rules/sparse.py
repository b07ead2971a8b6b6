"""Sparse (COO) matrix products on fake tensors: torch has no SparseMeta kernel for `mm` and
`addmm`, so a GCN's `torch.spmm(adj, x @ W)` (and its backward, `adj.t() @ grad`) stopped the
capture. On CUDA, cuSPARSE's SpMM returns a dense (rows x cols) matrix; its small buffer for
the sparse descriptors is not modelled."""

from __future__ import annotations

import torch

from peakmem.cuda_rules.registry import register_sparse_kernel


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
