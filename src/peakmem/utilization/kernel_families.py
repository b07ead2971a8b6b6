"""The kernel families a costed op belongs to, and the trace-metadata key of the utilization
record (no torch import: the estimate's process reads them from the trace's metadata after the
job's child has exited, and importing torch there cost 3-6 s of every estimate)."""

from __future__ import annotations

# codes kept short: they travel in the trace's metadata
GEMM = "gemm"  # cuBLAS matmul
CONV = "conv"  # cuDNN convolution (forward and backward)
ATTENTION = "attn"  # flash / memory-efficient attention
ELEMENTWISE = "elem"  # TensorIterator kernels: pointwise, copies, fills
REDUCTION = "red"  # reductions, softmax, norms, losses
FOREACH = "foreach"  # multi_tensor_apply kernels (optimizers, grad clipping)
FAMILIES = (GEMM, CONV, ATTENTION, ELEMENTWISE, REDUCTION, FOREACH)

META_KEY = "utilization"
"""The trace-metadata key the capture's observer writes its record under."""
