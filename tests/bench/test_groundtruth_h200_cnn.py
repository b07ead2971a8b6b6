"""peakmem against one measured H200 CNN run (benchmarks/groundtruth/h200.csv, torch 2.11,
cuDNN 9.19): with the per-shape workspace table of the sm_90 stack, the replay reserves what
torch reported (docs/cnn.md). EfficientNet-B0 in bf16 autocast at batch 128: its 1x1 and
stride-2 convolutions are not in the grid and come from the table's nearest neighbours; the
factor model carried over from the A100 had its reserved peak 16% off."""

import pytest

from peakmem.baselines.peakmem_estimator import PeakmemEstimator
from peakmem.datasets.loaders import load_rows


def _torchvision_loads() -> bool:
    from peakmem.capture.vision_ops import declare_torchvision_ops

    declare_torchvision_ops()  # torchvision's C ops do not load next to a CPU-only torch
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


pytestmark = pytest.mark.skipif(not _torchvision_loads(), reason="torchvision does not import")

ROW = "h200:00064"


@pytest.mark.slow
def test_h200_efficientnet_row_reserved_and_allocated_within_one_percent():
    row = next(r for r in load_rows("groundtruth") if r.id == ROW)
    assert "efficientnet_b0 --precision bf16 --batch-size 128" in row.job["args"]
    estimate = PeakmemEstimator().run(row)
    reserved, allocated = (int(row.features[c]) for c in ("max_reserved_bytes", "max_allocated_bytes"))
    assert abs(estimate.peak_reserved_bytes - reserved) <= 0.01 * reserved
    assert abs(estimate.peak_allocated_bytes - allocated) <= 0.005 * allocated
