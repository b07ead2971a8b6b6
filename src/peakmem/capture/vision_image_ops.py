"""torchvision.io's image decoding without its compiled `image` extension, through Pillow.

torchvision's `image.so` links against a CUDA build of torch, as `_C.so` does (vision_ops.py):
with a CPU-only torch it cannot load, `torchvision.io.image._has_image_ops()` answers False and
`read_image` / `decode_image` / `decode_png` / `decode_jpeg` / `read_file` raise "Couldn't load
the image extension". Data pipelines written with them (the PyTorch tutorials' custom Dataset,
transformers' run_clip.py) then fail here although on the job's GPU machine they only read
files on the host.

When the extension is present but cannot load, `declare_image_ops` defines the operators those
functions call (`image::read_file`, `decode_image`, `decode_png`, `decode_jpeg`, with
torchvision's schemas) with host kernels that decode through Pillow to the same uint8 (C, H, W)
tensors (16-bit PNGs: uint16), and `image_ops_available` (a library patch) makes
`torchvision.io.image` report its ops as loaded while the job runs. GIF, WebP, AVIF / HEIC
decoding and the encoders stay unavailable, with torchvision's own error.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import patch_on_import
from peakmem.capture.vision_ops import _loads, extension_file

IMAGE_SCHEMAS: dict[str, str] = {
    "read_file": "read_file(str filename) -> Tensor",
    "decode_image": "decode_image(Tensor data, int mode, bool apply_exif_orientation=False) -> Tensor",
    "decode_png": "decode_png(Tensor data, int mode, bool apply_exif_orientation=False) -> Tensor",
    "decode_jpeg": "decode_jpeg(Tensor data, int mode, bool apply_exif_orientation=False) -> Tensor",
}
"""Each operator as torchvision's `csrc/io/image/image.cpp` declares it in the `image` namespace."""

PIL_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
"""`ImageReadMode` values (GRAY, GRAY_ALPHA, RGB, RGB_ALPHA) as Pillow modes; 0 (UNCHANGED)
keeps the file's own."""

NOTE = (
    "torchvision's image extension could not load with this torch (a CPU-only build): "
    "peakmem decoded the job's read_image / decode_image calls with Pillow (host memory only)"
)

_library: torch.library.Library | None = None  # kept alive: dropping it undefines the ops
_used = False


def image_library(package_dir: Path | None = None) -> Path | None:
    """torchvision's `image` extension file, or None if torchvision is not installed."""
    return extension_file("image", package_dir)


def _defined(name: str) -> bool:
    try:
        return torch._C._get_operation_overload(f"image::{name}", "") is not None
    except RuntimeError:
        return False


def declared() -> bool:
    """Whether this process decodes torchvision.io's images with the kernels defined here."""
    return _library is not None


def used() -> bool:
    """Whether a job in this process read or decoded an image through them."""
    return _used


def read_file(filename: str) -> torch.Tensor:
    """The file's bytes as a 1-D uint8 tensor (torchvision's `read_file`)."""
    global _used
    _used = True
    data = Path(filename).read_bytes()
    if not data:
        raise RuntimeError(f"Expected a non empty file: {filename}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode(data: torch.Tensor, mode: int, apply_exif_orientation: bool = False) -> torch.Tensor:
    """Encoded image bytes (a 1-D uint8 CPU tensor) as a (C, H, W) tensor: uint8, or uint16
    for a 16-bit grayscale PNG read unchanged; `mode` an `ImageReadMode` value."""
    from PIL import Image, ImageOps

    global _used
    _used = True
    if data.dtype != torch.uint8 or data.dim() != 1 or data.device.type != "cpu":
        raise RuntimeError("Expected a 1-dimensional uint8 CPU tensor of encoded image bytes")
    image = Image.open(io.BytesIO(data.numpy().tobytes()))
    if apply_exif_orientation:
        image = ImageOps.exif_transpose(image)
    if mode in PIL_MODES:
        image = image.convert(PIL_MODES[mode])
    elif mode != 0:
        raise RuntimeError(f"Unsupported image mode {mode}")
    elif image.mode in ("P", "1", "CMYK", "YCbCr"):
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode.startswith("I;16") or image.mode == "I":
        array = np.array(image, dtype=np.int32).astype(np.uint16)
    else:
        array = np.array(image, dtype=np.uint8)  # a writable copy
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))


_KERNELS = {"read_file": read_file, "decode_image": decode, "decode_png": decode, "decode_jpeg": decode}


def declare_image_ops(package_dir: Path | None = None) -> bool:
    """Define torchvision's image operators with the Pillow kernels above if its `image`
    extension is installed but cannot load and nothing defined them yet. True if this call
    defined any. Called at each capture's start: `used()` then answers for this capture only
    (a warm process runs many)."""
    global _library, _used
    _used = False
    if _defined("decode_image"):
        return False
    library = image_library(package_dir)
    if library is None or _loads(library):
        return False
    if _library is None:
        _library = torch.library.Library("image", "FRAGMENT")  # noqa: TOR901
    defined = False
    for name, schema in IMAGE_SCHEMAS.items():
        if not _defined(name):
            _library.define(schema)
            # CompositeExplicitAutograd: read_file has no tensor argument to dispatch on
            _library.impl(name, _KERNELS[name], "CompositeExplicitAutograd")
            defined = True
    return defined


def _report_loaded(module: Any):
    original = getattr(module, "_has_image_ops", None)
    if original is None or not declared():
        return lambda: None
    module._has_image_ops = lambda: True

    def undo() -> None:
        module._has_image_ops = original

    return undo


@register_library_patch("torchvision_image_ops")
@contextmanager
def image_ops_available() -> Iterator[None]:
    """torchvision.io.image reports its ops loaded while the job runs, once they are declared."""
    with patch_on_import("torchvision.io.image", _report_loaded):
        yield
