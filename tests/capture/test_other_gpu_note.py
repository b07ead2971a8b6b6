"""Tensors on a second GPU in one process (`cuda:1` beside `cuda:0`): peakmem models one GPU per
process, counts them together and says so (capture.device_map.note_other_gpu)."""

from __future__ import annotations

import pytest

from peakmem.estimate import estimate_command

MIB = 2**20


@pytest.mark.parametrize("second, noted", [
    ('torch.empty(2**18, device="cuda:1")', True),
    ("torch.empty(2**18).to(torch.device('cuda', 1))", True),
    ("torch.empty(2**18).cuda(1)", True),
    ('torch.empty(2**18, device=torch.device(0))', False),
    ('torch.empty(2**18).to("cuda")', False),
])
def test_a_second_gpu_is_noted(tmp_path, second, noted):
    script = tmp_path / "two.py"
    script.write_text(f'import torch\na = torch.empty(2**18, device="cuda:0")\nb = {second}\n')
    result = estimate_command(["python", str(script)], gpu="a100-40gb", mode="fake",
                              isolate=False)
    assert result.peak_allocated_bytes == 2 * MIB  # counted together either way
    assert any("besides its current device cuda:0" in note for note in result.notes) is noted
