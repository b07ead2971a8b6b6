"""torchvision whose compiled ops cannot load (a CPU-only torch): schemas declared, nothing else."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from peakmem.capture.vision_ops import TORCHVISION_SCHEMAS, compiled_library


def _run(code: str) -> str:
    """In a fresh interpreter: declaring operators is process-wide and cannot be undone."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.strip()


def test_unloadable_library_gets_the_schemas_and_meta_kernels_can_attach(tmp_path):
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "_C.so").write_bytes(b"not a shared object")
    out = _run(f"""
        from pathlib import Path
        import torch
        from peakmem.capture import vision_ops
        first = vision_ops.declare_torchvision_ops(Path({str(package)!r}))
        again = vision_ops.declare_torchvision_ops(Path({str(package)!r}))
        # what torchvision/_meta_registrations.py then does
        lib = torch.library.Library("torchvision", "IMPL", "Meta")
        lib.impl("roi_align", lambda x, rois, s, h, w, r, a: x.new_empty((rois.size(0), x.size(1), h, w)))
        y = torch.ops.torchvision.roi_align(torch.empty(2, 8, 32, 32, device="meta"),
                                            torch.empty(5, 5, device="meta"), 0.5, 7, 7, 2, True)
        print(first, again, vision_ops.declared(), tuple(y.shape),
              torch.ops.torchvision._deform_conv2d_backward.default._schema.returns.__len__())
    """)
    assert out == "True False True (5, 8, 7, 7) 5"


def test_nothing_is_declared_without_torchvision_or_when_its_library_loads(tmp_path):
    assert compiled_library(tmp_path) is None  # no _C extension there
    package = tmp_path / "torchvision"
    package.mkdir()
    out = _run(f"""
        from pathlib import Path
        from peakmem.capture import vision_ops
        print(vision_ops.declare_torchvision_ops(Path({str(package)!r})), vision_ops.declared())
    """)
    assert out == "False False"


def test_every_schema_is_in_the_torchvision_namespace_form():
    names = [schema.split("(", 1)[0] for schema in TORCHVISION_SCHEMAS]
    assert len(set(names)) == len(names)
    assert {"nms", "roi_align", "roi_pool", "deform_conv2d"} <= set(names)


def test_real_torchvision_models_build_on_the_declared_schemas():
    import importlib.util

    import pytest

    library = compiled_library()
    if importlib.util.find_spec("torchvision") is None or library is None:
        pytest.skip("torchvision is not installed")
    out = _run("""
        import torch
        from peakmem.capture import vision_ops
        vision_ops.declare_torchvision_ops()
        import torchvision
        model = torchvision.models.resnet18().to("meta")
        print(tuple(model(torch.empty(2, 3, 64, 64, device="meta")).shape))
    """)
    assert out == "(2, 1000)"
