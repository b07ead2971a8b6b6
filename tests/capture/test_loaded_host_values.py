"""Tensors a job loads onto the device from a checkpoint (`torch.load(map_location="cuda")`)
keep the file's values for host reads in fake mode while nothing writes to them: a resume that
restores the RNG state (`torch.set_rng_state(ckpt["rng"].cpu())`, which refuses an all-zero
state) or reads a saved metric runs on fake tensors instead of failing over to eager mode."""

import pytest
import torch

from peakmem.capture import capture_callable


@pytest.mark.parametrize("default_device", [None, "cuda"])
def test_checkpoint_values_loaded_onto_the_device_are_read_back(default_device, a100, stack24,
                                                                 tmp_path):
    path = tmp_path / "ckpt.pt"
    weights = torch.arange(5000, dtype=torch.float32)
    torch.save({"rng": torch.get_rng_state(), "best": torch.tensor(0.25), "w": weights}, path)
    seen = {}

    def job():
        torch.set_default_device(default_device)  # a notebook's (None: torch's own)
        ckpt = torch.load(path, map_location="cuda")
        seen["device"] = ckpt["rng"].device.type
        torch.set_rng_state(ckpt["rng"].cpu())
        seen["rng"] = torch.equal(torch.get_rng_state(), torch.load(path)["rng"])
        seen["best"] = ckpt["best"].item()
        seen["w"] = ckpt["w"][:3].tolist()
        ckpt["w"].mul_(2)  # a known write: followed (capture/known_values.py)
        seen["doubled"] = ckpt["w"][:3].tolist()
        ckpt["w"].mul_(torch.randn(5000, device="cuda"))  # written with unknown values
        seen["after_write"] = ckpt["w"][:3].tolist()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"device": "cuda", "rng": True, "best": 0.25, "w": [0.0, 1.0, 2.0],
                    "doubled": [0.0, 2.0, 4.0],
                    "after_write": [0.0, 0.0, 0.0]}  # fake mode: unknown values read as zeros
