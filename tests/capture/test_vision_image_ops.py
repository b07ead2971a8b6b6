"""torchvision.io's image decoding through Pillow when its `image` extension cannot load
(capture/vision_image_ops.py): the tensors torchvision's own decoders give (uint8 (C, H, W),
the ImageReadMode conversions, uint16 for a 16-bit PNG), and `read_image` working inside the
capture's library patch only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peakmem.capture import vision_image_ops, vision_ops
from peakmem.capture.library_patches import LIBRARY_PATCHES

PIL = pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def image_io():
    library = vision_image_ops.image_library()
    if library is None or vision_ops._loads(library):
        pytest.skip("torchvision's image extension loads here (or torchvision is not installed)")
    vision_ops.declare_torchvision_ops()
    vision_image_ops.declare_image_ops()
    assert vision_image_ops.declared()
    import torchvision.io

    return torchvision.io


def _rgba(path, size=(5, 3)):
    rng = np.random.default_rng(0)
    array = rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    PIL.fromarray(array, "RGBA").save(path)
    return array


def test_read_image_outside_the_capture_fails_as_torchvision_does(image_io, tmp_path):
    _rgba(tmp_path / "a.png")
    with pytest.raises(RuntimeError, match="Couldn't load the image extension"):
        image_io.read_image(str(tmp_path / "a.png"))


def test_png_modes_give_torchvision_shapes_and_values(image_io, tmp_path):
    array = _rgba(tmp_path / "a.png")  # 5 wide, 3 high
    with LIBRARY_PATCHES["torchvision_image_ops"]():
        unchanged = image_io.read_image(str(tmp_path / "a.png"))
        rgb = image_io.read_image(str(tmp_path / "a.png"), mode=image_io.ImageReadMode.RGB)
        gray = image_io.decode_image(str(tmp_path / "a.png"), mode="GRAY")
        data = image_io.read_file(str(tmp_path / "a.png"))
        png = image_io.decode_png(data, mode=image_io.ImageReadMode.RGB_ALPHA)
    assert unchanged.dtype == torch.uint8 and unchanged.shape == (4, 3, 5)
    assert torch.equal(unchanged, torch.from_numpy(array).permute(2, 0, 1))
    assert torch.equal(rgb, unchanged[:3])
    assert gray.shape == (1, 3, 5) and gray.dtype == torch.uint8
    assert data.dtype == torch.uint8 and data.dim() == 1 and data.numel() == (tmp_path / "a.png").stat().st_size
    assert torch.equal(png, unchanged)
    assert vision_image_ops.used()


def test_jpeg_and_16_bit_png(image_io, tmp_path):
    PIL.new("RGB", (8, 6), (200, 10, 30)).save(tmp_path / "b.jpg", quality=95)
    PIL.fromarray(np.full((2, 4), 40000, dtype=np.uint16)).save(tmp_path / "c.png")
    with LIBRARY_PATCHES["torchvision_image_ops"]():
        jpeg = image_io.decode_jpeg(image_io.read_file(str(tmp_path / "b.jpg")))
        deep = image_io.read_image(str(tmp_path / "c.png"))
    assert jpeg.shape == (3, 6, 8) and jpeg.dtype == torch.uint8
    assert abs(int(jpeg[0, 0, 0]) - 200) <= 3 and abs(int(jpeg[1, 0, 0]) - 10) <= 3
    assert deep.shape == (1, 2, 4) and deep.dtype == torch.uint16 and int(deep[0, 0, 0]) == 40000


def test_the_patch_is_undone_after_the_capture(image_io, tmp_path):
    import torchvision.io.image as module

    with LIBRARY_PATCHES["torchvision_image_ops"]():
        assert module._has_image_ops()
    assert not module._has_image_ops()


def test_used_answers_for_the_current_capture_only(image_io, tmp_path):
    """A warm process runs many captures: the note belongs to the one that decoded an image."""
    _rgba(tmp_path / "a.png")
    with LIBRARY_PATCHES["torchvision_image_ops"]():
        image_io.read_image(str(tmp_path / "a.png"))
    assert vision_image_ops.used()
    vision_image_ops.declare_image_ops()  # what the next capture's start calls
    assert not vision_image_ops.used()
