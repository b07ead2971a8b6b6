"""Loading weights during a capture reads only their metadata.

The estimate does not depend on weight values, so a checkpoint whose values only ever go to the
device is never read into host memory:

- safetensors: `safe_open(path, framework="pt", device=...)` (and so `safetensors.torch.load_file`,
  HF `from_pretrained`, sharded or not) parses the file's header only; `get_tensor` / `get_slice`
  give host-deferred tensors (capture.host_deferred) of the right shape and dtype, or device
  tensors (a tracked device allocation) when `device` is the GPU. A host read of one (`.item()`,
  printing, an op with real host data) reads its values from the file then.
- `torch.load(path, map_location=None | "cpu" | "cuda")`: loaded memory-mapped (a zipfile
  checkpoint; nothing is read), then every tensor of at least DEFER_MIN_NUMEL bytes becomes a
  host-deferred tensor backed by the mapping (reads read the file), moved to the device for a
  GPU `map_location`. Other loads (file objects, legacy checkpoints) load as torch does, then
  are moved for a GPU `map_location`; a `map_location` dict or callable (`storage.cuda()`) is
  followed with every storage read to the host, then moved where it sent them to a GPU.

Eager mode loads everything for real (only the GPU `map_location` of `torch.load` is handled).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from peakmem.capture.device_specs import is_cuda_spec, is_host_spec
from peakmem.capture.host_deferred import map_containers as _map_containers
from peakmem.capture.session import CaptureSession
from peakmem.cuda_rules.true_device import true_device

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "U16": torch.uint16, "U32": torch.uint32,
    "U64": torch.uint64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}


def _is_host_location(location: Any) -> bool:
    """No `map_location` (each storage where it was saved) or the host."""
    return location is None or is_host_spec(location)


_HF_SYNC_LOAD = "HF_DEACTIVATE_ASYNC_LOAD"


class _Active:
    """The capture's host-deferral mode while weights loading is patched (None otherwise)."""

    mode: Any = None


# -- safetensors ---------------------------------------------------------------------------------
class DeferredSafeOpen:
    """`safetensors.safe_open` as the job sees it during a capture: the header from the real
    handle (memory-mapped, never read), tensors host-deferred or on the fake device."""

    def __init__(self, original: Any, filename: Any, framework: str, device: Any, kwargs: dict):
        self._handle = original(filename, framework=framework, device="cpu", **kwargs)
        self._original = original
        self._filename = filename
        self._framework = framework
        self._kwargs = kwargs
        self._device = device

    def __enter__(self) -> DeferredSafeOpen:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._handle.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def keys(self) -> list[str]:
        return self._handle.keys()

    def metadata(self) -> Any:
        return self._handle.metadata()

    def get_slice(self, name: str) -> DeferredSlice:
        return DeferredSlice(self, name)

    def get_tensor(self, name: str) -> torch.Tensor:
        tensor = self._host(name)
        if is_cuda_spec(self._device):
            return _Active.mode.move(tensor, None)
        return tensor

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {name: self.get_tensor(name) for name in self.keys()}

    def _host(self, name: str) -> torch.Tensor:
        real_slice = self._handle.get_slice(name)
        dtype = _SAFETENSORS_DTYPES.get(real_slice.get_dtype())
        if dtype is None:  # a dtype torch cannot hold fake: read it
            return self._handle.get_tensor(name)
        original, filename, framework, kwargs = (
            self._original, self._filename, self._framework, self._kwargs
        )

        def read() -> torch.Tensor:
            with original(filename, framework=framework, device="cpu", **kwargs) as handle:
                return handle.get_tensor(name)

        return _Active.mode.defer_host(tuple(real_slice.get_shape()), dtype, read)


class DeferredSlice:
    """`get_slice(name)`: shape and dtype from the header; indexing gives host-deferred views."""

    def __init__(self, parent: DeferredSafeOpen, name: str) -> None:
        self._parent = parent
        self._name = name
        self._real = parent._handle.get_slice(name)

    def get_shape(self) -> list[int]:
        return self._real.get_shape()

    def get_dtype(self) -> str:
        return self._real.get_dtype()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __getitem__(self, index: Any) -> torch.Tensor:
        tensor = self._parent._host(self._name)[index]
        if is_cuda_spec(self._parent._device):
            return _Active.mode.move(tensor, None)
        return tensor


def _deferred_safe_open(original: Any) -> Any:
    def safe_open(filename: Any, framework: str = "pt", device: Any = "cpu", **kwargs: Any) -> Any:
        mode = _Active.mode
        if mode is None or not mode.defer_construction or framework not in ("pt", "torch"):
            return original(filename, framework=framework, device=device, **kwargs)
        if not (_is_host_location(device) or is_cuda_spec(device)):
            return original(filename, framework=framework, device=device, **kwargs)
        return DeferredSafeOpen(original, filename, framework, device, kwargs)

    safe_open.__peakmem_original__ = original  # type: ignore[attr-defined]
    return safe_open


# -- torch.load ----------------------------------------------------------------------------------
def _mappable(path: Any) -> bool:
    """Whether torch can memory-map `path`: `UntypedStorage.from_file` takes a UTF-8 path, so a
    name with bytes that are not UTF-8 (surrogate escapes: `sd\\udc80.pt`) raised
    UnicodeEncodeError, where the job's own `torch.load` (no mmap) reads it."""
    name = os.fspath(path)
    if not isinstance(name, str):
        return False
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _deferred_load(original_load: Any) -> Any:
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        mode = _Active.mode
        to_device = is_cuda_spec(map_location)
        if mode is not None and (callable(map_location) or isinstance(map_location, dict)):
            return _load_mapped(original_load, mode, f, map_location, args, kwargs)
        if mode is None or not (to_device or _is_host_location(map_location)):
            return original_load(f, map_location, *args, **kwargs)
        # no map_location: each storage goes where it was saved (a GPU checkpoint to the GPU)
        saved_on: dict[int, str] = {}

        def host(storage: Any, location: str) -> Any:
            saved_on[storage.data_ptr()] = location
            return storage

        location = host if map_location is None else "cpu"
        fake = mode.defer_construction
        mapped = False
        if fake and isinstance(f, (str, os.PathLike)) and "mmap" not in kwargs and _mappable(f):
            try:
                loaded = original_load(f, location, *args, mmap=True, **kwargs)
                mapped = True
            except RuntimeError:  # not a zipfile checkpoint: cannot be memory-mapped
                saved_on.clear()
                loaded = original_load(f, location, *args, **kwargs)
        else:
            loaded = original_load(f, location, *args, **kwargs)
        # a storage saved on "meta" during a capture was a fake device storage (the device view's
        # torch.save writes device tensors as meta tensors): it loads onto the device
        moves = {
            ptr for ptr, where in saved_on.items() if is_cuda_spec(where.split(":")[0])
        }

        # device tensors saved during the capture are meta tensors, which torch saves without a
        # storage and loads as new meta tensors: a GPU load puts them on the device
        if map_location is None or to_device:
            loaded = _map_containers(
                lambda t: t.to("cuda") if _is_saved_device_tensor(t) else t, loaded
            )

        def on_device(tensor: torch.Tensor) -> bool:
            return to_device or tensor.untyped_storage().data_ptr() in moves

        if fake and (mapped or to_device or moves):
            return mode.defer_loaded(loaded, to_device=on_device)
        if to_device or moves:
            return _map_containers(
                lambda t: t.to("cuda") if _is_host_tensor(t) and on_device(t) else t, loaded
            )
        return loaded

    return load


def _load_mapped(original_load: Any, mode: Any, f: Any, map_location: Any, args: tuple,
                 kwargs: dict) -> Any:
    """`torch.load` with a `map_location` dict (`{"cuda:1": "cuda:0"}`) or callable
    (`lambda storage, loc: storage.cuda()`): every storage is read to the host, and those the
    job's mapping sends to a GPU are then moved to the device (deferred in fake mode)."""
    moves: set[int] = set()
    loaded = original_load(f, _host_restore(map_location, moves), *args, **kwargs)
    if not moves:
        return loaded

    def on_device(tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in moves

    if mode.defer_construction:
        return mode.defer_loaded(loaded, to_device=on_device)
    return _map_containers(
        lambda t: t.to("cuda") if _is_host_tensor(t) and on_device(t) else t, loaded
    )


def _host_restore(map_location: Any, moves: set[int]) -> Any:
    """A `map_location` callable for torch's loader that keeps every storage on the host and
    records in `moves` the ones the job's `map_location` puts on a GPU."""

    def restore(storage: Any, saved: str) -> Any:
        if isinstance(map_location, dict):
            target: Any = map_location.get(saved, saved)
        else:
            with _storage_moves_recorded(moves):
                result = map_location(storage, saved)
            if result is not None and not isinstance(result, str | torch.device):
                return result  # the storage itself (kept on the host) or one the job made
            target = saved if result is None else result
        if is_cuda_spec(target, ints=False):
            moves.add(storage.data_ptr())
        return storage

    return restore


@contextmanager
def _storage_moves_recorded(moves: set[int]) -> Iterator[None]:
    """While a `map_location` callable runs, `storage.cuda()` / `storage.to("cuda")` leave the
    storage on the host and record it in `moves` (a CPU torch cannot make a CUDA storage)."""
    base = torch.storage._StorageBase
    original_cuda, original_to = base.cuda, base.to

    def cuda(self: Any, device: Any = None, non_blocking: bool = False) -> Any:
        moves.add(self.data_ptr())
        return self

    def to(self: Any, *, device: Any, non_blocking: bool = False) -> Any:
        if is_cuda_spec(device):
            return cuda(self)
        return original_to(self, device=device, non_blocking=non_blocking)

    base.cuda, base.to = cuda, to
    try:
        yield
    finally:
        base.cuda, base.to = original_cuda, original_to


def _is_saved_device_tensor(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and true_device(value).type == "meta"
    )


def _is_host_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cpu"


@contextmanager
def weights_loading(session: CaptureSession, mode: Any) -> Iterator[None]:
    """Patch safetensors' `safe_open` (also where a module imported it by name) and `torch.load`
    for the job's run."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    try:
        import safetensors
    except ImportError:
        safetensors = None
    if safetensors is not None:
        original = safetensors.safe_open
        replacement = _deferred_safe_open(original)
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict) and namespace.get("safe_open") is original:
                patch(module, "safe_open", replacement)
    patch(torch, "load", _deferred_load(torch.load))
    # transformers loads checkpoints in worker threads, where the capture's modes (thread-local)
    # do not apply: sequential loading keeps them in the job's thread
    saved_env = os.environ.get(_HF_SYNC_LOAD)
    os.environ[_HF_SYNC_LOAD] = "1"
    _Active.mode = mode
    try:
        yield
    finally:
        _Active.mode = None
        if saved_env is None:
            os.environ.pop(_HF_SYNC_LOAD, None)
        else:
            os.environ[_HF_SYNC_LOAD] = saved_env
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
