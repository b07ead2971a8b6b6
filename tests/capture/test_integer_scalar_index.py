"""A 0-d integer device tensor used as an index is read on the host (capture/slice_bounds.py).

PyTorch's indexing makes `x[i]` with a 0-d integer tensor `i` a `select` at `i.item()`: on a
fake tensor that was `.item()` on meta and fake mode stopped. diffusers' DDPMScheduler
(`previous_timestep`: `self.timesteps[index + 1]`, `index` from `nonzero()`) runs it at every
denoising step of a DDPMPipeline / StableDiffusionPipeline."""

import torch

from peakmem.capture import capture_callable


def run(job, a100, stack24, mode="fake"):
    result = capture_callable(job, gpu=a100, stack=stack24, steps="all", mode=mode)
    assert result.error is None, result.error_text
    return result


def test_a_zero_dim_integer_device_index_selects_like_an_int(a100, stack24):
    seen = {}

    def job():
        timesteps = torch.arange(999, -1, -333, device="cuda")  # DDPMScheduler.set_timesteps
        t = timesteps[1]
        index = (timesteps == t).nonzero(as_tuple=True)[0][0]
        seen["next"] = timesteps[index + 1].shape
        grid = torch.zeros(4, 3, device="cuda")
        seen["row"] = grid[index, :].shape
        grid[index] = 1.0
        # a list of them: the index tensor is built from their values (read on the host too)
        seen["gather"] = grid[[index, index]].shape

    run(job, a100, stack24)
    assert seen == {"next": torch.Size([]), "row": torch.Size([3]),
                    "gather": torch.Size([2, 3])}


def test_eager_mode_reads_the_real_index(a100, stack24):
    seen = {}

    def job():
        timesteps = torch.arange(999, -1, -333, device="cuda")
        index = (timesteps == timesteps[1]).nonzero(as_tuple=True)[0][0]
        seen["next"] = int(timesteps[index + 1])

    run(job, a100, stack24, mode="eager")
    assert seen == {"next": 333}
