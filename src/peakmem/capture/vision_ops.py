"""torchvision without its compiled ops: declare their schemas so `import torchvision` works.

torchvision's wheels on PyPI link against a CUDA build of torch (libc10_cuda, libtorch_cuda).
With a CPU-only torch, such as the one this tool runs on, `torchvision/_C.so` cannot load, and
`import torchvision` then fails in `torchvision/_meta_registrations.py`, which registers Meta
kernels for operators (`torchvision::nms`, `roi_align`, ...) that nobody defined. Every
torchvision or timm model, classification included, becomes impossible to estimate although
none of those operators runs in it.

When (and only when) the compiled library is present but cannot load, `declare_torchvision_ops`
defines the operator schemas (from torchvision's `csrc/ops/*.cpp` `TORCH_LIBRARY_FRAGMENT`
declarations, `SymInt` sizes as in torchvision >= 0.17) with no kernels: the import succeeds,
torchvision's own Meta kernels attach to them, and torchvision reports `_has_ops() == False`, so
calling one of these operators (detection models' nms, roi_align) still fails with
torchvision's own "Couldn't load custom C++ ops" message.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import torch

TORCHVISION_SCHEMAS: tuple[str, ...] = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, "
    "float rois_scale, int rois_zero_point, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
    "float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width) -> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width) -> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
    "float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, "
    "SymInt channels, SymInt height, SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
    "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, "
    "Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, "
    "SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, "
    "bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
)
"""Each operator as `torchvision::<schema>` declares it."""

NOTE = (
    "torchvision's compiled ops could not load with this torch (a CPU-only build): peakmem "
    "declared their schemas so torchvision imports; its detection ops (nms, roi_align, ...) "
    "cannot run here"
)

_library: torch.library.Library | None = None  # kept alive: dropping it undefines the ops


def extension_file(stem: str, package_dir: Path | None = None) -> Path | None:
    """torchvision's compiled extension `stem` (`_C`, `image`), or None if torchvision (or that
    file) is not installed."""
    if package_dir is None:
        spec = importlib.util.find_spec("torchvision")
        if spec is None or not spec.submodule_search_locations:
            return None
        package_dir = Path(next(iter(spec.submodule_search_locations)))
    candidates = sorted(package_dir.glob(f"{stem}.*so")) + sorted(package_dir.glob(f"{stem}.*pyd"))
    return candidates[0] if candidates else None


def compiled_library(package_dir: Path | None = None) -> Path | None:
    """torchvision's `_C` extension file, or None if torchvision is not installed."""
    return extension_file("_C", package_dir)


def compiled_library_loads(package_dir: Path | None = None) -> bool:
    """Whether torchvision is installed with a compiled library this torch can load, i.e.
    whether its ops (nms, roi_align, ...) can run for real here."""
    library = compiled_library(package_dir)
    return library is not None and _loads(library)


def _loads(path: Path) -> bool:
    try:
        ctypes.CDLL(str(path))
    except OSError:
        return False
    return True


def _defined(name: str) -> bool:
    try:
        return torch._C._get_operation_overload(f"torchvision::{name}", "") is not None
    except RuntimeError:
        return False


def declared() -> bool:
    """Whether this process runs torchvision on schemas declared here."""
    return _library is not None


def declare_torchvision_ops(package_dir: Path | None = None) -> bool:
    """Define the schemas of torchvision's operators if its compiled library cannot load and
    nothing defined them yet. True if this call defined any."""
    global _library
    if _defined("nms"):
        return False
    library = compiled_library(package_dir)
    if library is None or _loads(library):
        return False
    if _library is None:
        _library = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901
    defined = False
    for schema in TORCHVISION_SCHEMAS:
        if not _defined(schema.split("(", 1)[0]):
            _library.define(schema)
            defined = True
    return defined
