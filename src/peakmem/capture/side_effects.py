"""Keep a captured job from overwriting real files with fake device data.

Inside the capture the job's device tensors have no values (meta tensors), and host reads of
them are answered with placeholder zeros. A job that saves its model (`torch.save`,
`safetensors`, `numpy.save`, HF `save_pretrained`, Lightning checkpoints, ...) would replace the
user's real checkpoint with weightless tensors. While the capture runs, every save function in
:data:`SAVE_FUNCTIONS` checks what it is about to write: when it holds fake device data it is
written under a per-capture scratch directory instead (same relative name) and the capture notes
it; anything else (logs, real host tensors) is written where the job said. A job that loads a
file it saved (`torch.load`, safetensors' `load_file`, `numpy.load`: :data:`LOAD_FUNCTIONS`) reads
the diverted copy, as it would have read its own save.

Targets: a path (str / PathLike) is diverted. A file object is the job's own: an in-memory one
(BytesIO) is written to as asked; a real file the job opened for writing (it has a `name` that
is an existing file) is diverted too: its content goes to the scratch copy and the handle is left
untouched (opening it with "w" may already have emptied it; that was the job's own `open`).

Fake device data is recognised by the tensor's true device (meta, or cuda: no real CUDA tensor
exists in a capture), or by host storage that came from a host read of a device tensor (zeros in
fake mode, shadow values in eager mode); numpy arrays are traced to the tensor they view. Copies
made from such host tensors (`.clone()`, `.to(dtype)`) are real host data to this check.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import sys
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import Any

import torch

from peakmem.capture import device_map
from peakmem.capture.namespace_index import namespaces_binding
from peakmem.capture.on_import import ImportHook
from peakmem.capture.session import CaptureSession
from peakmem.capture.value_names import ZeroNamedSaves
from peakmem.jobs.file_journal import before_native_write

_FAKE_DEVICE_TYPES = frozenset({"meta", "cuda"})


# -- what a save writes ------------------------------------------------------------------------


def _arg(index: int, name: str) -> Callable[[tuple, dict], list[Any]]:
    def data(args: tuple, kwargs: dict) -> list[Any]:
        if name in kwargs:
            return [kwargs[name]]
        return [args[index]] if len(args) > index else []

    return data


def _all_after_first(args: tuple, kwargs: dict) -> list[Any]:
    """numpy.savez(file, *arrays, **named_arrays)."""
    return [*args[1:], *kwargs.values()]


@dataclass(frozen=True)
class SaveFunction:
    """A function that writes tensors or arrays to a file: where the data and the target are."""

    module: str
    name: str
    data: Callable[[tuple, dict], list[Any]]
    target: tuple[int, str]
    write_fake: Callable[[tuple, dict, str], Any] | None = None
    """How to write fake device data when the function itself cannot (safetensors has no
    values to copy out of a meta tensor); called with the target replaced."""

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}"

    def target_of(self, args: tuple, kwargs: dict) -> Any:
        index, name = self.target
        if name in kwargs:
            return kwargs[name]
        return args[index] if len(args) > index else None

    def with_target(self, args: tuple, kwargs: dict, value: Any) -> tuple[tuple, dict]:
        index, name = self.target
        if name in kwargs:
            return args, {**kwargs, name: value}
        return (*args[:index], value, *args[index + 1:]), kwargs


# -- safetensors of fake tensors: the header and a sparse (unwritten) data section ---------------

_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32",
    torch.uint64: "U64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def write_fake_safetensors(tensors: dict[str, torch.Tensor], path: str, metadata: Any) -> None:
    """A valid safetensors file holding `tensors`' names, dtypes and shapes, with zeros for
    values; the data section is a hole in the file (no memory, no disk)."""
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name]
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES.get(tensor.dtype, "U8"),
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in dict(metadata).items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as file:
        file.write(len(text).to_bytes(8, "little"))
        file.write(text)
        with suppress(OSError):  # past a file-size limit (--sandbox): the header alone
            file.truncate(8 + len(text) + offset)


def _safetensors_file(args: tuple, kwargs: dict, path: str) -> None:
    tensors = kwargs.get("tensors", args[0] if args else {})
    metadata = kwargs.get("metadata", args[2] if len(args) > 2 else None)
    write_fake_safetensors(dict(tensors), path, metadata)


def _safetensors_model(args: tuple, kwargs: dict, path: str) -> None:
    model = kwargs.get("model", args[0] if args else None)
    metadata = kwargs.get("metadata", args[2] if len(args) > 2 else None)
    write_fake_safetensors(dict(model.state_dict()), path, metadata)


SAVE_FUNCTIONS: tuple[SaveFunction, ...] = (
    SaveFunction("torch", "save", _arg(0, "obj"), (1, "f")),
    SaveFunction("safetensors.torch", "save_file", _arg(0, "tensors"), (1, "filename"),
                 _safetensors_file),
    SaveFunction("safetensors.torch", "save_model", _arg(0, "model"), (1, "filename"),
                 _safetensors_model),
    SaveFunction("numpy", "save", _arg(1, "arr"), (0, "file")),
    SaveFunction("numpy", "savez", _all_after_first, (0, "file")),
    SaveFunction("numpy", "savez_compressed", _all_after_first, (0, "file")),
    SaveFunction("numpy", "savetxt", _arg(1, "X"), (0, "fname")),
    # Lightning writes torch.save's bytes to the checkpoint path itself (fsspec)
    SaveFunction("lightning.fabric.utilities.cloud_io", "_atomic_save", _arg(0, "checkpoint"),
                 (1, "filepath")),
    SaveFunction("lightning_fabric.utilities.cloud_io", "_atomic_save", _arg(0, "checkpoint"),
                 (1, "filepath")),
)
"""Save functions checked during a capture. HF `save_pretrained` / `Trainer.save_model` and
`accelerate.save` end in safetensors' `save_file` or `torch.save`; Lightning in `_atomic_save`.
A module that imported one of these by name (`from safetensors.torch import save_file`) is
covered too: its binding is replaced while the capture runs."""


@dataclass(frozen=True)
class LoadFunction:
    """A function that reads a file the job may have saved: a diverted file is read from the
    scratch directory, so a job that saves and reloads its checkpoint sees its own save."""

    module: str
    name: str
    target: tuple[int, str]
    forgets: bool = False
    """The call removes the file (`os.remove`): the diverted copy is removed in its place and
    the path is no longer redirected (a real file the save left untouched stays)."""

    target_of = SaveFunction.target_of
    with_target = SaveFunction.with_target


@dataclass(frozen=True)
class MoveFunction:
    """A function that moves a file (`os.replace(src, dst)`, `os.rename`): a diverted `src`
    moves inside the scratch directory to `dst`'s scratch name, and `dst` is read from there
    (a job's atomic save: `torch.save(state, tmp)` then `os.replace(tmp, path)`)."""

    module: str
    name: str


LOAD_FUNCTIONS: tuple[LoadFunction, ...] = (
    LoadFunction("torch", "load", (0, "f")),
    LoadFunction("safetensors.torch", "load_file", (0, "filename")),
    LoadFunction("numpy", "load", (0, "file")),
    # Lightning checks that the checkpoint exists (fsspec) before it opens it itself:
    # `trainer.test(ckpt_path="best")` after `fit` saved its checkpoints
    LoadFunction("lightning.fabric.plugins.io.torch_io", "TorchCheckpointIO.load_checkpoint",
                 (1, "path")),
    LoadFunction("lightning_fabric.plugins.io.torch_io", "TorchCheckpointIO.load_checkpoint",
                 (1, "path")),
    # Lightning's FSDP / ModelParallel strategies check `path.is_file()` themselves, then read
    # the full checkpoint lazily (`trainer.validate(ckpt_path="best")` after an FSDP fit)
    LoadFunction("lightning.fabric.strategies.fsdp", "_is_full_checkpoint", (0, "path")),
    LoadFunction("lightning.fabric.utilities.load", "_lazy_load", (0, "filename")),
    # the size of a checkpoint the job has just saved (torchtune's checkpointers log
    # `os.path.getsize(output_path)` right after `save_file`): the diverted copy's size
    LoadFunction("genericpath", "getsize", (0, "filename")),
    # a job that removes the checkpoint it saved (pytorch/examples' ddp main.py: rank 0's
    # `os.remove(CHECKPOINT_PATH)` after every rank loaded it); `Path.unlink` calls os.unlink
    LoadFunction("os", "remove", (0, "path"), forgets=True),
    LoadFunction("os", "unlink", (0, "path"), forgets=True),
)
"""A dotted name is a method, replaced on its class (args[0] is the instance)."""

MOVE_FUNCTIONS: tuple[MoveFunction, ...] = (
    MoveFunction("os", "replace"),
    MoveFunction("os", "rename"),
)
"""`Path.replace` / `Path.rename` call these; `shutil.move` calls `os.rename` first."""


# -- fake device data --------------------------------------------------------------------------


class HostCopies:
    """Host storages that hold a device tensor's values (placeholder zeros / eager shadows)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, tensor: Any) -> Any:
        if isinstance(tensor, torch.Tensor) and not _is_fake_tensor(tensor, None):
            storage = tensor.untyped_storage()
            key = id(storage)
            self._refs[key] = weakref.ref(storage, lambda _, key=key: self._refs.pop(key, None))
        return tensor

    def __contains__(self, tensor: torch.Tensor) -> bool:
        if not self._refs:
            return False
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return False
        ref = self._refs.get(id(storage))
        return ref is not None and ref() is storage


def _is_fake_tensor(tensor: torch.Tensor, host_copies: HostCopies | None) -> bool:
    with torch._C.DisableTorchFunction():
        device = torch._C.TensorBase.device.__get__(tensor)
        if device.type in _FAKE_DEVICE_TYPES or torch._C.TensorBase.is_meta.__get__(tensor):
            return True
        return host_copies is not None and tensor in host_copies


def _array_tensor(array: Any) -> torch.Tensor | None:
    """The tensor a numpy array views (`tensor.numpy()`, `np.asarray(tensor)`), if any."""
    base = getattr(array, "base", None)
    for _ in range(64):
        if base is None or isinstance(base, torch.Tensor):
            return base
        base = getattr(base, "base", None)
    return None


class _Found(Exception):
    pass


class _NullSink:
    def write(self, data: Any) -> int:
        return len(data)


def holds_fake_device_data(obj: Any, host_copies: HostCopies | None = None) -> bool:
    """Whether `obj` (anything `torch.save` / pickle accepts) holds a tensor or array with fake
    device data anywhere inside it. Walks it as pickle would, without writing anything."""
    numpy = sys.modules.get("numpy")

    def check(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if _is_fake_tensor(value, host_copies):
                raise _Found
            return (tuple, ())  # do not serialise its data
        if numpy is not None and isinstance(value, numpy.ndarray):
            tensor = _array_tensor(value)
            if tensor is not None and _is_fake_tensor(tensor, host_copies):
                raise _Found
            return (tuple, ())
        return NotImplemented

    class Walker(pickle.Pickler):
        def reducer_override(self, value: Any) -> Any:
            return check(value)

    try:
        Walker(_NullSink(), protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    except _Found:
        return True
    except Exception:  # not picklable: look through containers, modules and attributes
        try:
            return _walk(obj, check, set())
        except RecursionError:
            return False  # torch.save would fail on it too
    return False


def _walk(obj: Any, check: Callable[[Any], Any], seen: set[int]) -> bool:
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    try:
        check(obj)
    except _Found:
        return True
    if isinstance(obj, torch.nn.Module):
        children: Any = list(obj.state_dict(keep_vars=True).values())
    elif isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, list | tuple | set | frozenset):
        children = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        children = list(vars(obj).values())
    else:
        return False
    return any(_walk(child, check, seen) for child in children)


# -- where a diverted file goes ----------------------------------------------------------------


def user_path(target: Any) -> str | None:
    """The file a save would write: a path, or a real file the job opened for writing. None for
    in-memory or other file objects (the job's own)."""
    if isinstance(target, str | bytes | os.PathLike):
        return os.fsdecode(target)
    if isinstance(target, io.IOBase) or hasattr(target, "write"):
        name = getattr(target, "name", None)
        writable = getattr(target, "writable", lambda: False)
        try:
            if isinstance(name, str | bytes) and writable() and os.path.isfile(name):
                return os.fsdecode(name)
        except (OSError, ValueError):
            return None
    return None


def scratch_name(path: str, cwd: str | None = None) -> Path:
    """`path` relative to the scratch directory: relative to the working directory when inside
    it, else the absolute path without its root; never with `..`."""
    absolute = os.path.abspath(path)
    base = os.path.abspath(cwd or os.getcwd())
    if os.path.commonpath([absolute, base]) == base and absolute != base:
        relative = os.path.relpath(absolute, base)
    else:
        relative = os.path.join("_abs", os.path.splitdrive(absolute)[1].lstrip(os.sep))
    parts = [part for part in Path(relative).parts if part not in ("..", ".", "")]
    return Path(*parts) if parts else Path("unnamed")


SCRATCH_PARENT: Path | None = None
"""Where a diverter makes its scratch directory (None: the system's temporary directory). The
capture's child process sets it to its private directory, which the parent owns and removes
after the job's process ended however it ended (capture.child, capture.supervised)."""
KEEP_SCRATCH = False
"""Keep a diverter's own scratch directory after its capture (tests read the diverted copies);
otherwise it is removed when the capture ends."""


@dataclass
class SaveDiverter:
    """Diverts saves of fake device data into `scratch` during one capture."""

    session: CaptureSession | None = None
    scratch: Path | None = None
    host_copies: HostCopies = field(default_factory=HostCopies)
    diverted: list[tuple[str, Path]] = field(default_factory=list)
    redirects: dict[str, Path] = field(default_factory=dict)
    """Absolute user path -> its diverted copy (read back by LOAD_FUNCTIONS)."""
    zero_named: ZeroNamedSaves = field(default_factory=ZeroNamedSaves)
    """Saves named with a zero after host reads that saw zeros (capture.value_names)."""
    _local: threading.local = field(default_factory=threading.local)
    made_scratch: bool = False
    """The scratch directory is this diverter's own (made on the first diverted save): it is
    removed when the capture ends (`remove_scratch`)."""

    def scratch_dir(self) -> Path:
        if self.scratch is None:
            parent = SCRATCH_PARENT if SCRATCH_PARENT is not None and SCRATCH_PARENT.is_dir() else None
            self.scratch = Path(tempfile.mkdtemp(prefix="peakmem-saves-", dir=parent))
            self.made_scratch = True
        self.scratch.mkdir(parents=True, exist_ok=True)
        return self.scratch

    def remove_scratch(self) -> None:
        """The capture ended: the diverted copies go, unless kept (`KEEP_SCRATCH`) or the
        directory was given."""
        if self.made_scratch and not KEEP_SCRATCH and self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)

    @contextmanager
    def _inside(self) -> Iterator[None]:
        self._local.busy = True
        try:
            yield
        finally:
            self._local.busy = False

    def call(self, entry: SaveFunction | LoadFunction | MoveFunction, original: Callable,
             args: tuple, kwargs: dict) -> Any:
        if isinstance(entry, LoadFunction):
            return self.load(entry, original, args, kwargs)
        if isinstance(entry, MoveFunction):
            return self.move(original, args, kwargs)
        if getattr(self._local, "busy", False):  # a save inside a save (save_model->save_file)
            return original(*args, **kwargs)
        target = entry.target_of(args, kwargs)
        path = user_path(target)
        if path is None:
            return original(*args, **kwargs)
        if self.session is not None and self.session.host_value is None:  # fake mode
            self.zero_named.saw(path, self.session.host_reads)
        with self._inside():
            fake = any(holds_fake_device_data(d, self.host_copies) for d in entry.data(args, kwargs))
        if not fake:
            self.redirects.pop(os.path.abspath(path), None)  # a real save: read it from now on
            if isinstance(target, str | bytes | os.PathLike):  # written outside Python's open
                before_native_write(path)
            return original(*args, **kwargs)
        destination = self.scratch_dir() / scratch_name(path)
        destination.parent.mkdir(parents=True, exist_ok=True)
        self.diverted.append((path, destination))
        try:
            with self._inside():
                if isinstance(target, str | bytes | os.PathLike):
                    args, kwargs = entry.with_target(args, kwargs, str(destination))
                    return self._write(entry, original, args, kwargs, str(destination))
                mode = "ab" if "a" in str(getattr(target, "mode", "")) else "wb"
                with open(destination, mode) as handle:
                    args, kwargs = entry.with_target(args, kwargs, handle)
                    return self._write(entry, original, args, kwargs, str(destination))
        finally:
            self._remember(path, destination)

    def _remember(self, path: str, destination: Path) -> None:
        self.redirects[os.path.abspath(path)] = destination
        for suffix in (".npy", ".npz"):  # numpy adds its suffix to a name without one
            added = destination.with_name(destination.name + suffix)
            if not destination.exists() and added.exists():
                self.redirects[os.path.abspath(path + suffix)] = added

    def load(self, entry: LoadFunction, original: Callable, args: tuple, kwargs: dict) -> Any:
        target = entry.target_of(args, kwargs)
        if not self.redirects:
            return original(*args, **kwargs)
        if isinstance(target, str | bytes | os.PathLike):
            if entry.forgets and kwargs.get("dir_fd") is not None:  # relative to a folder
                return original(*args, **kwargs)
            path = os.path.abspath(os.fsdecode(target))
            destination = self.redirects.get(path)
            if destination is not None and destination.exists():
                as_given = destination if isinstance(target, Path) else str(destination)
                args, kwargs = entry.with_target(args, kwargs, as_given)
                if entry.forgets:
                    del self.redirects[path]
            return original(*args, **kwargs)
        destination = self._redirected_handle(target)
        if destination is None:
            return original(*args, **kwargs)
        # a file the job opened itself (`with open(path, "rb") as f: torch.load(f)`): read the
        # diverted copy from where the job's handle stands, and leave that handle at its end
        with open(destination, "rb") as handle:
            with suppress(OSError, ValueError):
                handle.seek(target.tell())
            args, kwargs = entry.with_target(args, kwargs, handle)
            result = original(*args, **kwargs)
            with suppress(OSError, ValueError):
                target.seek(0, os.SEEK_END)
        return result

    def move(self, original: Callable, args: tuple, kwargs: dict) -> Any:
        """`os.replace(src, dst)` / `os.rename(src, dst)` of a diverted `src`: its copy moves
        to `dst`'s place in the scratch directory; a real `dst` stays untouched."""
        if not self.redirects or len(args) < 2 or kwargs.get("src_dir_fd") is not None \
                or kwargs.get("dst_dir_fd") is not None:
            return original(*args, **kwargs)
        src, dst, *rest = args
        if not isinstance(src, str | bytes | os.PathLike) \
                or not isinstance(dst, str | bytes | os.PathLike):
            return original(*args, **kwargs)
        source = os.path.abspath(os.fsdecode(src))
        copy = self.redirects.get(source)
        if copy is None or not copy.exists():
            return original(*args, **kwargs)
        target = os.fsdecode(dst)
        moved = self.scratch_dir() / scratch_name(target)
        moved.parent.mkdir(parents=True, exist_ok=True)
        result = original(str(copy), str(moved), *rest, **kwargs)
        del self.redirects[source]
        self.redirects[os.path.abspath(target)] = moved
        return result

    def _redirected_handle(self, target: Any) -> Path | None:
        """The diverted copy of a real file the job opened for reading, if it saved one."""
        name = getattr(target, "name", None)
        if not isinstance(name, str | bytes) or not hasattr(target, "read"):
            return None
        destination = self.redirects.get(os.path.abspath(os.fsdecode(name)))
        if destination is None or not destination.exists():
            return None
        return destination

    def _write(self, entry: SaveFunction, original: Callable, args: tuple, kwargs: dict,
               destination: str) -> Any:
        if entry.write_fake is not None and any(
            holds_fake_device_data(d, None) for d in entry.data(args, kwargs)
        ):
            return entry.write_fake(args, kwargs, destination)
        return original(*args, **kwargs)

    def note(self) -> str | None:
        if not self.diverted:
            return None
        paths = list(dict.fromkeys(path for path, _ in self.diverted))
        shown = ", ".join(paths[:3]) + (f" (and {len(paths) - 3} more)" if len(paths) > 3 else "")
        return (
            f"the job saved {len(self.diverted)} file(s) of fake device data; they were written "
            f"to {self.scratch} instead of {shown}"
            + ("; that scratch directory was removed after the capture"
               if self.made_scratch and not KEEP_SCRATCH else "")
        )


# -- installing the checks ---------------------------------------------------------------------

_ACTIVE: list[SaveDiverter] = []
_WRAPPERS: dict[int, Callable] = {}  # id(original) -> its checking wrapper (kept for re-use)
_ORIGINALS: dict[int, Callable] = {}  # id(wrapper) -> original


def _wrapper(entry: SaveFunction | LoadFunction | MoveFunction, original: Callable) -> Callable:
    if id(original) in _ORIGINALS:  # already a wrapper
        return original
    wrapper = _WRAPPERS.get(id(original))
    if wrapper is None:

        @wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _ACTIVE:  # outside a capture (a module bound it while one ran)
                return original(*args, **kwargs)
            return _ACTIVE[-1].call(entry, original, args, kwargs)

        _WRAPPERS[id(original)] = wrapper
        _ORIGINALS[id(wrapper)] = original
    return wrapper


class _Patches:
    """The save functions' bindings replaced by wrappers, everywhere they are bound."""

    def __init__(self) -> None:
        self.replaced: list[tuple[Any, str, Any]] = []
        self.methods: list[tuple[type, str, Any]] = []

    def install(self, entries: tuple[SaveFunction | LoadFunction | MoveFunction, ...]) -> None:
        swaps: dict[int, Callable] = {}
        for entry in entries:
            module = sys.modules.get(entry.module)
            if "." in entry.name:
                self._install_method(module, entry)
                continue
            original = getattr(module, entry.name, None) if module is not None else None
            if callable(original) and id(original) not in _ORIGINALS:
                swaps[id(original)] = _wrapper(entry, original)
        if not swaps:
            return
        for namespace in namespaces_binding(swaps.keys()):  # few: the rest not looped over
            for name, value in list(namespace.items()):
                wrapper = swaps.get(id(value))
                if wrapper is not None and namespace.get(name) is value:
                    namespace[name] = wrapper
                    self.replaced.append((namespace, name, value))

    def _install_method(self, module: Any, entry: SaveFunction | LoadFunction) -> None:
        """`Class.method` of `module`: the wrapper is set on the class itself."""
        class_name, name = entry.name.rsplit(".", 1)
        owner = getattr(module, class_name, None) if module is not None else None
        original = vars(owner).get(name) if isinstance(owner, type) else None
        if callable(original) and id(original) not in _ORIGINALS:
            setattr(owner, name, _wrapper(entry, original))
            self.methods.append((owner, name, original))

    def restore(self) -> None:
        for namespace, name, original in reversed(self.replaced):
            if id(namespace.get(name)) in _ORIGINALS:
                namespace[name] = original
        self.replaced.clear()
        for owner, name, original in reversed(self.methods):
            if id(vars(owner).get(name)) in _ORIGINALS:
                setattr(owner, name, original)
        self.methods.clear()


@contextmanager
def divert_fake_saves(
    session: CaptureSession | None = None, scratch: Path | None = None
) -> Iterator[SaveDiverter]:
    """While inside, saves of fake device data go to `scratch` (a new temporary directory by
    default, made on the first such save); the note naming them goes to `session.notes`."""
    diverter = SaveDiverter(session=session, scratch=scratch)
    patches = _Patches()
    entries = (*SAVE_FUNCTIONS, *LOAD_FUNCTIONS, *MOVE_FUNCTIONS)
    finder = ImportHook(
        {entry.module for entry in entries},
        lambda module: patches.install(tuple(e for e in entries if e.module == module.__name__)),
    )
    saved_placeholder = device_map.placeholder
    saved_host_copy = device_map.host_copy
    saved_host_value = session.host_value if session is not None else None

    def placeholder(tensor: Any) -> Any:
        return diverter.host_copies.add(saved_placeholder(tensor))

    def host_copy(known: Any) -> Any:
        return diverter.host_copies.add(saved_host_copy(known))

    _ACTIVE.append(diverter)
    patches.install(entries)
    sys.meta_path.insert(0, finder)
    device_map.placeholder = placeholder
    device_map.host_copy = host_copy
    if saved_host_value is not None:
        session.host_value = lambda tensor: diverter.host_copies.add(saved_host_value(tensor))
    try:
        yield diverter
    finally:
        if saved_host_value is not None:
            session.host_value = saved_host_value
        device_map.placeholder = saved_placeholder
        device_map.host_copy = saved_host_copy
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        patches.restore()
        _ACTIVE.remove(diverter)
        for note in (diverter.note(), diverter.zero_named.note()):
            if note is not None and session is not None:
                session.notes.append(note)
        diverter.remove_scratch()
