"""Per-library patches for the fake device: a registry, one small patch per library behaviour
that would otherwise reach for real CUDA. Each is a context manager taking no argument, entered
for the capture's duration by `library_patches()` (capture/runner.py) and undone afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import torch
from torch.utils._pytree import tree_map

LibraryPatch = Callable[[], AbstractContextManager[None]]
LIBRARY_PATCHES: dict[str, LibraryPatch] = {}


def register_library_patch(name: str) -> Callable[[LibraryPatch], LibraryPatch]:
    def decorator(patch: LibraryPatch) -> LibraryPatch:
        if name in LIBRARY_PATCHES:
            raise ValueError(f"library patch {name!r} is already registered")
        LIBRARY_PATCHES[name] = patch
        return patch

    return decorator


@contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name = value` for the duration; nothing when `owner` has no `name`."""
    if not hasattr(owner, name):
        yield
        return
    own = vars(owner) if isinstance(owner, type) else None
    inherited = own is not None and name not in own
    original = getattr(owner, name) if own is None else own.get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if inherited:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


@contextmanager
def library_patches() -> Iterator[None]:
    """Every registered library patch, for the duration."""
    with ExitStack() as stack:
        for patch in LIBRARY_PATCHES.values():
            stack.enter_context(patch())
        yield


# -- torch.nn.DataParallel -----------------------------------------------------------------------


@register_library_patch("data_parallel_one_device")
@contextmanager
def data_parallel_one_device() -> Iterator[None]:
    """`nn.DataParallel` on one device runs the module directly, but still scatters its inputs
    with CUDA's comm kernels (a no-copy chunk on one device): here they are moved to the device
    (a no-op for device tensors). Its check that the parameters are on cuda:0 sees the device
    view. Over several devices (the job sees several: capture.data_parallel) its own scatter
    runs, on the fake runtime's comm primitives."""
    data_parallel = torch.nn.DataParallel
    original = data_parallel.scatter

    def scatter(self: Any, inputs: Any, kwargs: Any, device_ids: Any) -> Any:
        if len(device_ids) > 1:
            return original(self, inputs, kwargs, device_ids)
        device = torch.device("cuda", 0)

        def move(value: Any) -> Any:
            return value.to(device) if isinstance(value, torch.Tensor) else value

        return (tree_map(move, tuple(inputs)),), (tree_map(move, dict(kwargs or {})),)

    with patched(data_parallel, "scatter", scatter):
        yield


# -- torch.save ------------------------------------------------------------------------------------


@register_library_patch("torch_save_device_tensors")
@contextmanager
def torch_save_device_tensors() -> Iterator[None]:
    """`torch.save` of device tensors writes them as meta tensors (shape, dtype, no data), as
    before the device view: its pickler asks `tensor.device` from Python, and seeing `cuda` it
    would copy the storage to the host (a meta storage has no data). Values the job computed
    before calling save (`t.device`, the state dict's keys) are what the job saw."""
    original = torch.save

    def save(*args: Any, **kwargs: Any) -> Any:
        with torch._C.DisableTorchFunction():
            return original(*args, **kwargs)

    with patched(torch, "save", save), patched(torch.serialization, "save", save):
        yield


# -- wrapper subclasses made for the device ----------------------------------------------------------


@register_library_patch("wrapper_subclasses_on_the_fake_device")
@contextmanager
def wrapper_subclasses_on_the_fake_device() -> Iterator[None]:
    """A wrapper subclass made for the device (`_make_wrapper_subclass(..., device=cuda)`, from
    the device a device tensor reports: torchao's `NF4Tensor.from_tensor` passes
    `input_tensor.device`) is made on the meta device, as every device tensor of the capture is,
    and reports `cuda:0` to the job through the device view. Made on `cuda` it broke the
    CPU-only torch: `Tensor.copy_` into it (loading a checkpoint into QLoRA's NF4 weights)
    opens a CUDA device guard, and the subclass's own dispatch code, which runs with the
    capture's mode popped, moved tensors to its device (`copy_in.to(original.device)`)."""
    original = torch.Tensor._make_wrapper_subclass

    def make(cls: type, *args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        if device is not None:
            try:
                on_device = torch.device(device).type == "cuda"
            except (RuntimeError, TypeError):
                on_device = False
            if on_device:
                kwargs["device"] = torch.device("meta")
        return original(cls, *args, **kwargs)

    with patched(torch.Tensor, "_make_wrapper_subclass", staticmethod(make)):
        yield


# -- torch.backends.cudnn.is_acceptable ------------------------------------------------------------


@register_library_patch("cudnn_is_acceptable")
@contextmanager
def cudnn_is_acceptable() -> Iterator[None]:
    """`nn.LSTM`/`GRU` ask `torch.backends.cudnn.is_acceptable(weight)` before flattening their
    weights for cuDNN; with cuda tensors the CPU-only torch then warns that it has no cuDNN. The
    flattened-weight cuDNN RNN path is not modelled (its kernels have no meta implementation):
    the answer stays no, without the warning."""

    def is_acceptable(tensor: torch.Tensor) -> bool:
        return False

    with patched(torch.backends.cudnn, "is_acceptable", is_acceptable):
        yield


# -- storage addresses ---------------------------------------------------------------------------


@register_library_patch("meta_storage_addresses")
@contextmanager
def meta_storage_addresses() -> Iterator[None]:
    """`untyped_storage().data_ptr()` of a fake device storage is a distinct fake address
    (capture.fake_addresses): transformers' `save_pretrained` and safetensors tell shared tensors
    apart by it, and every meta storage would otherwise be at 0."""
    from peakmem.capture.fake_addresses import ADDRESSES

    storage_class = torch.UntypedStorage
    original = storage_class.data_ptr

    def data_ptr(self: Any) -> int:
        if self.device.type == "meta":
            return ADDRESSES.of(self)
        return original(self)

    with patched(storage_class, "data_ptr", data_ptr):
        yield


# -- fine-tuning libraries (bitsandbytes, torchtune): capture/finetune_libs.py --------------------

from peakmem.capture import bitsandbytes_model as _bitsandbytes_model  # noqa: E402,F401
from peakmem.capture import collective_buffers as _collective_buffers  # noqa: E402,F401
from peakmem.capture import deepspeed_ops as _deepspeed_ops  # noqa: E402,F401
from peakmem.capture import dtensor_state as _dtensor_state  # noqa: E402,F401
from peakmem.capture import fake_nvml as _fake_nvml  # noqa: E402,F401
from peakmem.capture import fastai_dataloader as _fastai_dataloader  # noqa: E402,F401
from peakmem.capture import fastai_optimizers as _fastai_optimizers  # noqa: E402,F401
from peakmem.capture import finetune_libs as _finetune_libs  # noqa: E402,F401  (registers them)
from peakmem.capture import frozen_weights as _frozen_weights  # noqa: E402,F401
from peakmem.capture import grad_scaler as _grad_scaler  # noqa: E402,F401
from peakmem.capture import hf_generation as _hf_generation  # noqa: E402,F401
from peakmem.capture import hf_masks as _hf_masks  # noqa: E402,F401
from peakmem.capture import hf_release as _hf_release  # noqa: E402,F401
from peakmem.capture import keras_optimizers as _keras_optimizers  # noqa: E402,F401
from peakmem.capture import lightning_fsdp_reload as _lightning_fsdp_reload  # noqa: E402,F401
from peakmem.capture import lightning_launch as _lightning_launch  # noqa: E402,F401
from peakmem.capture import lightning_val_check as _lightning_val_check  # noqa: E402,F401
from peakmem.capture import periodic_optimizers as _periodic_optimizers  # noqa: E402,F401
from peakmem.capture import ray_train as _ray_train  # noqa: E402,F401
from peakmem.capture import tensor_pickling as _tensor_pickling  # noqa: E402,F401
from peakmem.capture import vision_image_ops as _vision_image_ops  # noqa: E402,F401
from peakmem.capture import zero_partitions as _zero_partitions  # noqa: E402,F401

# -- torch.distributed ---------------------------------------------------------------------------


@register_library_patch("distributed_groups_destroyed")
@contextmanager
def distributed_groups_destroyed() -> Iterator[None]:
    """Process groups the job left behind (it need not call destroy_process_group) are destroyed
    when the capture ends, so the next capture in the process can create its own."""
    from peakmem.capture.fake_distributed import process_groups_destroyed

    with process_groups_destroyed():
        yield


# -- Hydra ----------------------------------------------------------------------------------------

HYDRA_FULL_ERROR = "HYDRA_FULL_ERROR"


@register_library_patch("hydra_job_errors_raised")
@contextmanager
def hydra_job_errors_raised() -> Iterator[None]:
    """`@hydra.main` catches the job's exception, prints a trimmed traceback and calls
    `sys.exit(1)` (hydra/_internal/utils.py `run_and_report`) unless HYDRA_FULL_ERROR=1: with it
    set for the capture, the exception reaches the capture as it would without Hydra, so a
    failure that fake values caused (a size checked after `torch.unique`) sends auto mode to
    eager, and the report names the error instead of "status 1". The job exits 1 either way."""
    saved = os.environ.get(HYDRA_FULL_ERROR)
    os.environ[HYDRA_FULL_ERROR] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(HYDRA_FULL_ERROR, None)
        else:
            os.environ[HYDRA_FULL_ERROR] = saved
