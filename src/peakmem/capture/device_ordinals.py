"""Device ordinals the job's GPUs do not have: `torch.zeros(1, device="cuda:99")`,
`t.to("cuda:5")`, `model.cuda(3)`, `torch.cuda.set_device(10**20)`, `with torch.cuda.device(7):`
on a one-GPU job. A CUDA machine raises there ("CUDA error: invalid device ordinal"); the fake
runtime used to put every ordinal on its one GPU and give an estimate of a job that cannot run.

The ordinals that exist are those of one node's GPUs: `torch.cuda.device_count()` as the fake
runtime answers it (1, or the local world size of a distributed launch: `--nproc-per-node N`, a
launcher's LOCAL_WORLD_SIZE, so `cuda:LOCAL_RANK` stays valid on every rank), and at least
`DEFAULT_GPUS_PER_NODE` (8, as a launcher without `--nproc-per-node` assumes): a process that
puts tensors on `cuda:1` beside `cuda:0` (model parallelism in one process) is not refused but
noted, its GPUs counted together (`device_map.note_other_gpu`). Making a `torch.device("cuda:99")` object is not an
error (CUDA checks the ordinal when it is used), and neither is a negative ordinal given to
`set_device` / `torch.cuda.device` (torch skips those: the current device stays)."""

from __future__ import annotations

from typing import Any

import torch

from peakmem.jobs.launchers import DEFAULT_GPUS_PER_NODE

INVALID_ORDINAL = "CUDA error: invalid device ordinal"


def check_ordinal(index: int | None) -> None:
    """Raise as CUDA does when `index` (None: the current device) names a GPU the job does not
    have."""
    if index is None or index < 0:
        return
    count = max(torch.cuda.device_count(), DEFAULT_GPUS_PER_NODE)
    if index >= count:
        raise RuntimeError(
            f"{INVALID_ORDINAL} (cuda:{index}: a node has cuda:0 to cuda:{count - 1} here; "
            "peakmem raises where a GPU would)"
        )


def check_device_spec(value: Any) -> None:
    """`check_ordinal` of a device argument naming a CUDA ordinal (`"cuda:N"`,
    `torch.device("cuda", N)`, a bare int N); anything else passes."""
    from peakmem.capture.device_map import gpu_index

    if isinstance(value, str) and value.startswith("cuda:") and not value[5:].isdigit():
        return  # torch's own parser refuses it
    check_ordinal(gpu_index(value))


def checked_set_device(device: Any) -> int:
    """The index `torch.cuda.set_device(device)` selects (checked); torch's own argument errors
    (`set_device("cpu")`) are raised as torch raises them."""
    from torch.cuda._utils import _get_device_index

    index = _get_device_index(device, optional=True)
    check_ordinal(index)
    return index
