"""Host tensors kept fake until their values are needed, and the job's own meta tensors.

`model = LlamaForCausalLM(cfg).to("cuda", dtype=torch.bfloat16)` builds the model on the HOST,
with real CPU tensors, then moves it. Built for real, an 8B model costs 30 GiB of host RAM before
any device memory is allocated. During a capture (fake mode) it is built fake:

- host factory calls (`torch.empty`, `zeros`, `ones`, `full`, `rand*`, `arange`, ...; `*_like`
  and `new_*` of a host tensor) made while an `nn.Module` is being constructed (a frame of
  `__init__`, `reset_parameters`, `_init_weights`, `init_weights`, `post_init`, `apply`, ... of
  an `nn.Module` on the stack) that make a tensor of at least DEFER_MIN_NUMEL elements return a
  meta tensor whose storage kind is "host" (`session.storage_kinds`): no host memory, and the
  recorder does not count it as device memory. Smaller ones stay real (drop-path schedules, RoPE
  frequencies, ... are read on the host while the model is built).
- ops on host-deferred tensors alone stay fake (in-place init `normal_`, `uniform_`, `fill_`,
  `zero_`, `copy_`; `.half()`, views, ...); their outputs are host-deferred too.
- moving one to the device (`.to("cuda")`, `.cuda()`, `.to(0)`, with a dtype too, `model.to`)
  is a device allocation of the moved size (category `input`, as a host-to-device copy is).
- where a real value is needed (`.item()`, `.tolist()`, `.numpy()`, printing, an op mixing it
  with real host data), it is computed then (capture.host_values): the factory call that made
  it and the in-place ops applied to it since are replayed on a real host tensor (random inits
  draw new random numbers of the same distribution; values copied in from a loaded checkpoint
  are read from the file), or, where that was not recorded, zeros. Every such read is counted and
  noted. A host-only job (a model trained on the CPU, never moved) thus runs and makes no device
  allocations.

The job's own meta tensors (`device="meta"`, `with torch.device("meta")`, accelerate's
`init_empty_weights`, `to("meta")` of a host-deferred tensor) are marked "meta": not device
memory until they are moved (`.to("cuda")`) or `to_empty(device="cuda")`'d.

The recorder asks `outputs_kind` what a new meta storage stands for, and skips host and meta ones.
Eager mode builds host tensors for real (it runs everything for real).
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._device as torch_device_context
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from peakmem.capture.arg_tensors import LEAF_TYPES, tensors_in
from peakmem.capture.backward_view import job_view_in_backward
from peakmem.capture.device_specs import is_cuda_spec, is_host_spec, is_meta_spec
from peakmem.capture.host_values import HostValues
from peakmem.capture.replaced_methods import ORIGINAL, canonical
from peakmem.capture.session import CaptureSession
from peakmem.trace.vocab import Category

TO = ORIGINAL["to"]
"""`Tensor.to` as peakmem found it: a job's replacement (a no-op `to`) does not move peakmem's copies."""

Tensor = torch.Tensor
HOST, META, DEVICE = "host", "meta", "device"
DEFER_MIN_NUMEL = 4096
"""Host tensors made while a model is built with fewer elements than this stay real."""
_NO_MODES = torch._C.DisableTorchFunction
_PLAIN_TENSORS = frozenset({Tensor, torch.nn.Parameter})
"""Tensor types whose `is_meta` is `device.type == "meta"` (no Python property of their own)."""
_ATTRIBUTE_READS = (Tensor.grad, Tensor.grad_fn, Tensor.layout, Tensor.is_sparse,
                    Tensor.requires_grad, Tensor.is_leaf, Tensor.shape, Tensor.dtype)
"""Tensor attributes the optimizers, autograd and modules read on every step (an Adam step reads
`grad`, `layout`, `grad_fn`, `is_sparse` of every parameter: half of a CNN row's torch-function
calls). Where neither mode handles their getter, `HostDeferral` reads them itself
(`_reads_attribute`)."""

_FACTORIES = {
    torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.randint,
    torch.randperm, torch.arange, torch.linspace, torch.logspace, torch.eye, torch.empty_strided,
}
_LIKE = {
    torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like, torch.rand_like,
    torch.randn_like, torch.randint_like,
}
_NEW = {Tensor.new_empty, Tensor.new_zeros, Tensor.new_ones, Tensor.new_full}
_READS = {
    Tensor.item, Tensor.tolist, Tensor.numpy, Tensor.__float__, Tensor.__int__, Tensor.__bool__,
    Tensor.__index__, Tensor.__complex__, Tensor.__format__, Tensor.__array__, Tensor.__repr__,
    Tensor.__str__,
}
IDLE_WHEN_UNMARKED = frozenset({*_READS, Tensor.cpu, Tensor.cuda})
"""Functions whose handler here (`_read`, `_cpu`, `_cuda`) returns NotImplemented unless an
argument is a host-deferred or meta tensor (a marked storage): with none, the mode hands the
call on as it hands on a function it has no handler for."""
_INIT_FUNCTIONS = frozenset({
    "__init__", "reset_parameters", "_reset_parameters", "_init_weights", "init_weights",
    "_initialize_weights", "initialize_weights", "_init_weight", "post_init", "apply",
    "smart_apply", "_initialize_weight", "reset_params", "init_params", "_init_params",
})
_STACK_LIMIT = 96
_COLLATE_FILE = "/".join(("torch", "utils", "data", "_utils", "collate.py"))
_COLLATE_DEPTH = 4
"""Frames above `torch.stack` searched for the DataLoader's default collate."""
_FETCH_FILE = "/".join(("torch", "utils", "data", "_utils", "fetch.py"))
_FETCH_DEPTH = 8
"""Frames above a random draw searched for a DataLoader fetch (the Dataset's `__getitem__`)."""
_SAMPLE_DRAWS = {torch.randn, torch.rand}
_BACKWARD_CALLS = (Tensor.backward, torch.autograd.backward, torch.autograd.grad)
"""Calls that run the autograd engine: the job's hooks in them see this mode too."""
_SHAPE_DESCRIPTORS = (Tensor.shape, Tensor.dtype, Tensor.layout, Tensor.is_nested, Tensor.ndim)
_SHAPE_METHODS = {Tensor.size, Tensor.dim, Tensor.numel, Tensor.element_size, Tensor.__len__}
"""What a lazily computed host tensor answers without its values: its shape-only twin has the
same shape, dtype and layout (the DataLoader's collate and the capture read them)."""
COLLATE_DEFER_MIN_NUMEL = 1 << 22
"""Collated batches with fewer elements (16 MiB of fp32) are stacked for real: while a
host-deferred tensor lives, every torch call of the job goes through the deferral's checks,
which costs more than stacking a small batch (measured: GPUMemNet MLP rows of 1-2 M elements
per batch got slower, CNN rows of 5.6 M faster)."""


HANDING_ON_FRAMES: set = set()
"""Code objects of the frames that only hand a torch call on to this mode's handler (the
capture's one mode, capture/capture_modes.py): not counted in the frame windows below, which
were measured with this mode pushed on its own."""


def _in_construction() -> bool:
    """Whether an `nn.Module` is being constructed or initialised somewhere up the stack."""
    frame = sys._getframe(2)
    depth = 0
    module = torch.nn.Module
    handing_on = HANDING_ON_FRAMES
    handing_on_names = {code.co_name for code in handing_on}  # a code object's hash is slow
    while frame is not None and depth < _STACK_LIMIT:
        code = frame.f_code
        name = code.co_name
        if name in handing_on_names and code in handing_on:
            frame = frame.f_back
            continue
        if name in _INIT_FUNCTIONS and code.co_argcount:
            first = frame.f_locals.get(code.co_varnames[0])
            if isinstance(first, module):
                return True
        frame = frame.f_back
        depth += 1
    return False


def _called_from(file_suffix: str, depth: int) -> bool:
    """Whether one of the `depth` frames above the caller's caller runs code of a file whose
    path ends with `file_suffix`."""
    frame = sys._getframe(3)
    handing_on = HANDING_ON_FRAMES
    handing_on_names = {code.co_name for code in handing_on}
    seen = 0
    while seen < depth:
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name not in handing_on_names or code not in handing_on:
            if code.co_filename.replace("\\", "/").endswith(file_suffix):
                return True
            seen += 1
        frame = frame.f_back
    return False


def _in_default_collate() -> bool:
    """Whether `torch.stack` was called by torch's default collate (`collate_tensor_fn`)."""
    return _called_from(_COLLATE_FILE, _COLLATE_DEPTH)


def _in_dataset_fetch() -> bool:
    """Whether a DataLoader is fetching a sample up the stack (a Dataset's `__getitem__`)."""
    return _called_from(_FETCH_FILE, _FETCH_DEPTH)


def _reads_shape_only(func: Any) -> bool:
    if func in _SHAPE_METHODS:
        return True
    owner = getattr(func, "__self__", None)
    return any(owner is descriptor for descriptor in _SHAPE_DESCRIPTORS)


def _draw_size(args: tuple, kwargs: dict) -> tuple[int, ...] | None:
    """The size of `torch.randn(*size)` / `torch.randn(size)` / `size=`, when plain ints."""
    size = kwargs.get("size", args[0] if len(args) == 1 and type(args[0]) in (
        list, tuple, torch.Size) else args)
    if "size" in kwargs and args:
        return None
    if not all(type(n) is int and n >= 0 for n in size):
        return None
    return tuple(size)


def _storage_id(tensor: Tensor) -> int:
    return id(tensor.untyped_storage())


@dataclass
class DeferralStats:
    tensors: int = 0
    bytes: int = 0


class HostDeferral(TorchFunctionMode):
    """The torch-function mode (entered on top of `CudaAsMeta`) that defers host tensors made
    while a model is built and routes moves of host-deferred and meta tensors to the device."""

    def __init__(self, session: CaptureSession) -> None:
        super().__init__()
        self.session = session
        self.kinds = session.storage_kinds
        self._per_thread = threading.local()
        self.values = HostValues(lambda value: self.kind(value) == HOST)
        self.stats = DeferralStats()
        self.defer_construction = not session.eager
        self._view_probe: bool | None = None
        self._handlers: dict[Any, Callable[[Any, tuple, dict], Any]] = {}
        for func in _FACTORIES:
            self._handlers[func] = self._factory
        for func in _LIKE | _NEW:
            self._handlers[func] = self._from_tensor
        self._handlers[ORIGINAL["to"]] = self._to
        self._handlers[torch._C._nn._parse_to] = self._parse_to
        self._handlers[ORIGINAL["cuda"]] = self._cuda
        self._handlers[ORIGINAL["cpu"]] = self._cpu
        for func in _READS:
            self._handlers[func] = self._read
        self._handlers[torch.stack] = self._collate_stack
        for func in _BACKWARD_CALLS:
            self._handlers[func] = self._backward
        self._attribute_reads = self._unhandled_attribute_reads()
        self.collated: set[int] = set()
        """Storages of batches the default collate stacked lazily (host data, not device)."""
        self._realized: dict[int, Tensor] = {}
        """The real values of the collated batches the job used on the host."""

    # -- per-thread state (threads the job starts run under this mode too: capture.threads) -----
    @property
    def making(self) -> str | None:
        """The storage kind the factory call now running in this thread makes, if decided."""
        return getattr(self._per_thread, "making", None)

    @making.setter
    def making(self, value: str | None) -> None:
        self._per_thread.making = value

    @property
    def moving(self) -> bool:
        return getattr(self._per_thread, "moving", False)

    @moving.setter
    def moving(self, value: bool) -> None:
        self._per_thread.moving = value

    @property
    def meta_context(self) -> int:
        """How many `with torch.device("meta")` / `set_default_device("meta")` calls are running."""
        return getattr(self._per_thread, "meta_context", 0)

    @meta_context.setter
    def meta_context(self, value: int) -> None:
        self._per_thread.meta_context = value

    # -- mode ----------------------------------------------------------------------------------
    def open(self) -> None:
        """What entering the mode sets up besides pushing it; `capture_modes.CaptureModes`
        opens it without pushing it."""
        self.session.host_deferral = self

    def close(self) -> None:
        self.session.host_deferral = None
        self.session.notes.extend(self.notes())

    def __enter__(self) -> HostDeferral:
        self.open()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.close()

    def handled_functions(self) -> Any:
        """The functions this mode has a handler for (a live view of its registry)."""
        return self._handlers.keys()

    def _unhandled_attribute_reads(self) -> frozenset:
        """The getters of `_ATTRIBUTE_READS` that no handler of this mode and no branch or
        registry entry of `CudaAsMeta` (capture/device_map.py) handles."""
        from peakmem.capture.device_map import _OWN_BRANCHES, CudaAsMeta
        from peakmem.capture.tensor_overrides import TENSOR_OVERRIDES
        from peakmem.cuda_rules import FUNCTION_RULES

        self._device_map_type = CudaAsMeta
        getters = (attribute.__get__ for attribute in _ATTRIBUTE_READS)
        return frozenset(
            getter for getter in getters
            if getter not in self._handlers and getter not in _OWN_BRANCHES
            and getter not in TENSOR_OVERRIDES and getter not in FUNCTION_RULES
        )

    def _reads_attribute(self, func, args: tuple) -> bool:
        """Whether `func(*args)` is an unhandled attribute read of a plain tensor whose storage
        is not marked (host, meta, lazily computed) with `CudaAsMeta` the only mode left below
        this one: the full path would hand it, unchanged, through `CudaAsMeta` (which passes
        it on as it is) to the getter itself, which `__torch_function__` then calls directly."""
        if len(args) != 1 or type(args[0]) not in _PLAIN_TENSORS:
            return False
        if torch._C._len_torch_function_stack() != 1 or type(
                torch._C._get_function_stack_at(0)) is not self._device_map_type:
            return False
        if not self.kinds:
            return True  # nothing marked: the full path hands every call on as it is
        tensor = args[0]
        with _NO_MODES():
            if tensor.is_meta and tensor.layout == torch.strided:
                key = id(tensor.untyped_storage())
                return key not in self.kinds and key not in self.collated
        return True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        func = canonical(func)  # a Tensor method the job replaced: the original's call
        if func in self._attribute_reads and not kwargs and self._reads_attribute(func, args):
            with _NO_MODES():
                return func(*args)
        kwargs = kwargs or {}
        handler = self._handlers.get(func)
        if handler is not None:
            result = handler(func, args, kwargs)
            if result is not NotImplemented:
                return result
        device = kwargs.get("device")
        if device is not None and self.making is None:
            if is_cuda_spec(device) and self.kinds:
                with self.make(DEVICE):
                    return func(*args, **kwargs)
            if is_meta_spec(device) and self._user_meta(device):
                with self.make(META):
                    return func(*args, **kwargs)
        if not self.kinds:
            return func(*args, **kwargs)
        return self._on_deferred(func, args, kwargs)

    @contextmanager
    def make(self, kind: str, *, moving: bool = False) -> Iterator[None]:
        """New meta storages made inside stand for `kind` (outer settings win)."""
        if self.making is not None:
            yield
            return
        self.making, self.moving = kind, moving
        try:
            yield
        finally:
            self.making, self.moving = None, False

    # -- kinds ---------------------------------------------------------------------------------
    def kind(self, tensor: Any) -> str | None:
        """"host", "meta", "device" for a meta tensor, None for anything else (true devices)."""
        if not isinstance(tensor, Tensor):
            return None
        with _NO_MODES():
            if tensor.device.type != "meta" or tensor.layout != torch.strided:
                return None
            return self.kinds.get(_storage_id(tensor), DEVICE)

    def mark(self, tensor: Tensor, kind: str) -> None:
        """Mark `tensor`'s (new) storage as `kind`; forgotten when the storage dies."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self.kinds:
            return
        self.kinds[key] = kind
        weakref.finalize(storage, self._forget, key)

    def _forget(self, key: int) -> None:
        self.kinds.pop(key, None)
        self.collated.discard(key)
        self._realized.pop(key, None)
        self.values.forget(key)

    def _user_meta(self, device: Any) -> bool:
        """Whether an explicit meta device is the job's own. A string "meta" or a
        `torch.device("meta")` context is; a `torch.device("meta")` object otherwise only when
        device tensors do not report meta (else it may be a device tensor's `.device`)."""
        if isinstance(device, str):
            return True
        if self.meta_context:
            return True
        if self._view_probe is None:
            probe = torch.empty(0, device="cuda")
            self._view_probe = probe.device.type == "cuda"
        return self._view_probe

    # -- factories -----------------------------------------------------------------------------
    def _factory(self, func, args: tuple, kwargs: dict):
        device = kwargs.get("device")
        if not self.defer_construction or not (device is None or is_host_spec(device)):
            return NotImplemented
        if device is None and self.session.default_device_cuda:
            # `torch.set_default_device("cuda")`: its mode sits below this one and fills in the
            # device after it; the tensor is the device's, not a host one to defer
            return NotImplemented
        if kwargs.get("out") is not None or kwargs.get("layout") not in (None, torch.strided):
            return NotImplemented
        if not _in_construction():
            if func in _SAMPLE_DRAWS:
                return self._sample_draw(func, args, kwargs)
            return NotImplemented
        return self._defer(func, args, kwargs)

    def _sample_draw(self, func, args: tuple, kwargs: dict):
        """A Dataset drawing a random host sample (`torch.randn(C, H, W)` in `__getitem__`): a
        lazily drawn host tensor (shape only) of at least DEFER_MIN_NUMEL elements. Like a
        lazily stacked batch, it is drawn for real on its first use on the host (with new
        random numbers from the generator as it then stands); the default collate stacks lazy
        samples into a lazy batch, and a batch or sample moved to the device is the same input
        allocation. The utilization model counts the draw as the host op it stands for. Host
        random numbers drawn after it (labels, the sampler's order) come from a generator that
        did not draw the sample's: other values, the same shapes."""
        if set(kwargs) - {"dtype", "device", "size"} or not _in_dataset_fetch():
            return NotImplemented
        size = _draw_size(args, kwargs)
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
        if size is None or not dtype.is_floating_point:
            return NotImplemented
        numel = 1
        for n in size:
            numel *= n
        if numel < DEFER_MIN_NUMEL:
            return NotImplemented
        real_kwargs = dict(kwargs, device="cpu")

        def draw() -> Tensor:
            with _NO_MODES():
                return func(*args, **real_kwargs)

        sample = self.defer_host(size, dtype, draw)
        self.collated.add(_storage_id(sample))
        self._observe_host_op(func.__name__, numel * dtype.itemsize, random=True)
        return sample

    def _observe_host_op(self, name: str, made_bytes: int, *, random: bool = False) -> None:
        """Tell the utilization model about a host op that runs lazily (or never)."""
        observer = self.session.op_observer
        if observer is not None:
            host_op = getattr(getattr(observer, "__self__", None), "observe_host_op", None)
            if host_op is not None:
                host_op(name, made_bytes, random=random)

    def _from_tensor(self, func, args: tuple, kwargs: dict):
        source = args[0] if args else kwargs.get("input")
        device = kwargs.get("device")
        if not self.defer_construction or not isinstance(source, Tensor):
            return NotImplemented
        if device is not None and not is_host_spec(device):
            return NotImplemented
        with _NO_MODES():
            real_host = source.device.type == "cpu" and source.layout == torch.strided
        if not real_host or kwargs.get("layout") not in (None, torch.strided):
            return NotImplemented
        if not _in_construction():
            return NotImplemented
        return self._defer(func, args, kwargs)

    def _defer(self, func, args: tuple, kwargs: dict):
        meta_kwargs = dict(kwargs, device="meta")
        if func in _LIKE or func in _NEW:  # the source is a real host tensor: size from a meta twin
            source = args[0] if args else kwargs["input"]
            with self.make(HOST), _NO_MODES():
                twin = torch.empty_like(source, device="meta")
            if args:
                meta_args = (twin, *args[1:])
            else:
                meta_args, meta_kwargs["input"] = args, twin
        else:
            meta_args = args
        with self.make(HOST):
            tensor = func(*meta_args, **meta_kwargs)
        with _NO_MODES():
            small = tensor.numel() < DEFER_MIN_NUMEL
        if small:
            return func(*args, **kwargs)
        real_kwargs = {k: v for k, v in kwargs.items() if k not in ("requires_grad", "pin_memory")}
        real_kwargs["device"] = "cpu"
        self.values.made_by(tensor, func, args, real_kwargs)
        self.stats.tensors += 1
        self.stats.bytes += tensor.untyped_storage().nbytes()
        return tensor

    def _collate_stack(self, func, args: tuple, kwargs: dict):
        """The DataLoader's default collate stacking real host samples into a batch: the batch
        is host-deferred (shape only); its values are stacked for real only where the job reads
        them (a read of stacked values, not a placeholder: not noted). A batch that goes
        straight to the device costs no host stacking."""
        if not self.defer_construction or len(args) > 2 or set(kwargs) - {"dim", "out"}:
            return NotImplemented
        tensors = args[0] if args else None
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if kwargs.get("out") is not None or dim != 0 or type(tensors) not in (list, tuple):
            return NotImplemented
        if not tensors:
            return NotImplemented
        with _NO_MODES():
            first = tensors[0]
            if type(first) is not Tensor:
                return NotImplemented
            shape, dtype = first.shape, first.dtype
            lazy = first.device.type == "meta"  # samples drawn lazily (_sample_draw)
            for tensor in tensors:
                if (type(tensor) is not Tensor or tensor.layout != torch.strided
                        or tensor.requires_grad or tensor.dtype != dtype
                        or tensor.shape != shape):
                    return NotImplemented
                if lazy:
                    if (tensor.device.type != "meta"
                            or _storage_id(tensor) not in self.collated
                            or self.kinds.get(_storage_id(tensor)) != HOST):
                        return NotImplemented
                elif tensor.device.type != "cpu":
                    return NotImplemented
            numel = first.numel() * len(tensors)
        if (numel < COLLATE_DEFER_MIN_NUMEL and not lazy) or not _in_default_collate():
            return NotImplemented
        samples = list(tensors)

        def stack() -> Tensor:
            if lazy:
                reals = [self._collated_value(sample, _storage_id(sample)) for sample in samples]
            else:
                reals = samples
            with _NO_MODES():
                return torch.stack(reals)

        batch = self.defer_host((len(samples), *shape), dtype, stack)
        self.collated.add(_storage_id(batch))
        # the host op the real stack is, for the utilization model
        self._observe_host_op("stack", numel * first.element_size())
        return batch

    def defer_host(self, shape: Any, dtype: torch.dtype, base: Callable[[], Tensor]) -> Tensor:
        """A new host-deferred tensor whose values `base()` reads when they are needed."""
        with self.make(HOST), _NO_MODES():
            tensor = torch.empty(shape, dtype=dtype, device="meta")
        self.values.read_from(tensor, base)
        return tensor

    def defer_loaded(
        self, loaded: Any, to_device: Callable[[Tensor], bool] = lambda tensor: False
    ) -> Any:
        """Loaded host tensors (e.g. memory-mapped from a checkpoint) as host-deferred ones: host
        ops on them stay fake and never read the file; a real value is read when needed.
        Tensors sharing a storage keep sharing one; those `to_device` picks are moved to the
        device (one device storage per loaded storage, as a GPU load makes)."""
        bases: dict[int, Tensor] = {}
        device_bases: dict[int, Tensor] = {}

        def convert(value: Any) -> Any:
            if type(value) not in (Tensor, torch.nn.Parameter):
                return value
            with _NO_MODES():
                if value.device.type != "cpu" or value.layout != torch.strided:
                    return value
                storage = value.untyped_storage()
                small = storage.nbytes() < DEFER_MIN_NUMEL
                move = to_device(value)
            if small:
                return value.to("cuda") if move else value
            key = id(storage)
            base = bases.get(key)
            if base is None:
                with _NO_MODES():
                    real = torch.empty(0, dtype=torch.uint8, device="cpu").set_(storage)
                base = self.defer_host((storage.nbytes(),), torch.uint8, lambda r=real: r)
                bases[key] = base
            if move:
                if key not in device_bases:
                    device_bases[key] = self.move(base, None)
                base = device_bases[key]
            with self.make(HOST if not move else DEVICE), _NO_MODES():
                view = torch.empty(0, dtype=value.dtype, device="meta").set_(
                    base.untyped_storage(), value.storage_offset(), value.size(), value.stride()
                )
            if isinstance(value, torch.nn.Parameter):
                loaded_tensor = torch.nn.Parameter(view, requires_grad=value.requires_grad)
            else:
                loaded_tensor = view.requires_grad_(value.requires_grad)
            if move:
                _keep_loaded_values(loaded_tensor, value)
            return loaded_tensor

        return map_containers(convert, loaded)

    def _backward(self, func, args: tuple, kwargs: dict):
        """`loss.backward()` / `autograd.grad`: the hooks and custom Functions autograd runs see
        this mode as the job's forward did (a host-deferred tensor moved to the device in a
        backward hook is a device tensor: DeepSpeed ZeRO-3 fetches offloaded parameters there)."""
        with job_view_in_backward(self, bare=True):
            if not self.kinds:
                return func(*args, **kwargs)
            return self._on_deferred(func, args, kwargs)

    # -- moves ---------------------------------------------------------------------------------
    def _to(self, func, args: tuple, kwargs: dict):
        tensor = args[0]
        kind = self.kind(tensor)
        parsed = _parse_to(args[1:], kwargs)
        if parsed is None:
            return NotImplemented
        device, dtype, non_blocking, copy, memory_format = parsed
        target = self._target(device)
        if kind is None:  # a real tensor
            if target == META and (self._user_meta(device) or _in_construction()):
                with self.make(META):
                    return func(*args, **kwargs)
            return NotImplemented
        if kind == DEVICE:
            return NotImplemented
        if target == META and kind == HOST:
            if not (self._user_meta(device) or _in_construction()):  # a device tensor's `.device`
                target = DEVICE
            else:
                with self.make(META):
                    return _to_copy(tensor, "meta", dtype, non_blocking, memory_format)
        if target == DEVICE:
            return self.move(tensor, dtype, non_blocking, memory_format, from_host=kind == HOST)
        if target is None or (target == HOST and kind == HOST) or (target == META and kind == META):
            if (dtype is None or dtype == tensor.dtype) and not copy and memory_format is None:
                return tensor
            out = _to_copy(tensor, None, dtype, non_blocking, memory_format)
            if kind == HOST:
                with _NO_MODES():
                    before = {_storage_id(tensor)}
                self.values.derived(
                    _to_copy, (tensor, None, dtype, False, memory_format), {}, out, before
                )
            return out
        return NotImplemented  # the job's meta tensor to the host: CudaAsMeta's host read

    def _parse_to(self, func, args: tuple, kwargs: dict):
        """`nn.Module.to`'s argument parser: a GPU stays a GPU (`torch.device("cuda", N)`, also
        for an ordinal), so the tensor moves that follow are seen as moves to the device."""
        if args and is_cuda_spec(args[0]):
            device, args = args[0], ("cpu", *args[1:])
        elif is_cuda_spec(kwargs.get("device")):
            device, kwargs = kwargs["device"], dict(kwargs, device="cpu")
        else:
            return NotImplemented
        _cpu, dtype, non_blocking, memory_format = func(*args, **kwargs)
        return _cuda_device(device), dtype, non_blocking, memory_format

    def _target(self, device: Any) -> str | None:
        if isinstance(device, Tensor):
            kind = self.kind(device)
            if kind is not None:
                return kind
            with _NO_MODES():
                return HOST if device.device.type == "cpu" else None
        if device is None:
            return None
        if is_cuda_spec(device):
            return DEVICE
        if is_host_spec(device):
            return HOST
        if is_meta_spec(device):
            return META
        return None

    def _cuda(self, func, args: tuple, kwargs: dict):
        tensor = args[0]
        kind = self.kind(tensor)
        if kind not in (HOST, META):
            return NotImplemented
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        return self.move(tensor, None, non_blocking, kwargs.get("memory_format"),
                         from_host=kind == HOST)

    def move(self, tensor: Tensor, dtype: torch.dtype | None, non_blocking: bool = False,
             memory_format: Any = None, *, from_host: bool = True) -> Tensor:
        """A host-deferred or meta tensor copied to the device: a tracked device allocation. A
        loaded one (a checkpoint's tensor, or one computed from it) keeps its values for host
        reads, read from the file when first needed (`device_map.give_lazy_host_data`)."""
        with self.make(DEVICE, moving=from_host):
            moved = _to_copy(tensor, "cuda", dtype, non_blocking, memory_format)
        if from_host and self.values.is_loaded(tensor):
            from peakmem.capture.device_map import give_lazy_host_data

            give_lazy_host_data(moved, lambda: self.values.materialize(tensor, count=False))
        return moved

    def _cpu(self, func, args: tuple, kwargs: dict):
        return args[0] if self.kind(args[0]) == HOST else NotImplemented

    # -- values --------------------------------------------------------------------------------
    def _read(self, func, args: tuple, kwargs: dict):
        if not self.kinds:
            return NotImplemented
        if not any(self.kind(t) == HOST for t in tensors_in((args, kwargs))):
            return NotImplemented
        real_args, real_kwargs = tree_map(self._real_or_same, (args, kwargs))
        return func(*real_args, **real_kwargs)

    def _real_or_same(self, value: Any) -> Any:
        if self.kind(value) != HOST:
            return value
        if self.collated:
            with _NO_MODES():
                key = _storage_id(value)
            if key in self.collated:
                return self._collated_value(value, key)
        real = self.values.materialize(value)
        if value.requires_grad and real.is_floating_point():
            real.requires_grad_(True)
        return real

    def _collated_value(self, tensor: Tensor, key: int) -> Tensor:
        """The real values of a lazily stacked batch (stacked once, on its first use on the
        host), as a view of `tensor`'s geometry. The utilization model already counted the
        stack when the batch was collated: the ops made here are not shown to it."""
        real = self._realized.get(key)
        observer, self.session.op_observer = self.session.op_observer, None
        try:
            if real is None:
                real = self.values.materialize(tensor, count=False)
                with _NO_MODES():
                    real = torch.empty(0, dtype=torch.uint8, device="cpu").set_(real.untyped_storage())
                self._realized[key] = real
            with _NO_MODES():
                return torch.empty(0, dtype=tensor.dtype, device="cpu").set_(
                    real.untyped_storage(), tensor.storage_offset(), tensor.size(),
                    tensor.stride())
        finally:
            self.session.op_observer = observer

    # -- ops on host-deferred tensors ----------------------------------------------------------
    def _on_deferred(self, func, args: tuple, kwargs: dict):
        tensors = tensors_in((args, kwargs))
        if not tensors or not self._any_marked(tensors):
            # no host-deferred, job's meta or lazily computed tensor among them: the op as it is
            return func(*args, **kwargs)
        if self.collated:
            with _NO_MODES():
                used = any(t.device.type == "meta" and _storage_id(t) in self.collated
                           for t in tensors)
            if used and not _reads_shape_only(func):
                # a lazily computed batch or sample used on the host: from now on, its real values
                real_args, real_kwargs = tree_map(self._real_or_same, (args, kwargs))
                return func(*real_args, **real_kwargs)
        with _NO_MODES():
            kinds = [self.kinds.get(_storage_id(t), DEVICE) if t.device.type == "meta" else None
                     for t in tensors if t.layout == torch.strided]
            real = any(t.device.type != "meta" and t.dim() > 0 for t in tensors)
        if HOST not in kinds:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if (name.endswith("_") and not name.startswith("__")) or func is ORIGINAL["__setitem__"]:
            # `t.normal_(...)`, or `nn.init.normal_(tensor=t, ...)` as torch-function dispatch
            # passes it
            target = args[0] if args else kwargs.get("tensor", kwargs.get("input"))
            if self.kind(target) == HOST:
                return self._in_place(func, target, args, kwargs)
        if real and DEVICE not in kinds and META not in kinds:
            # real host data meets a host-deferred tensor: compute on the host with real values
            real_args, real_kwargs = tree_map(self._real_or_same, (args, kwargs))
            return func(*real_args, **real_kwargs)
        with _NO_MODES():
            before = {id(t.untyped_storage()) for t in tensors if t.device.type == "meta"}
        out = func(*args, **kwargs)
        self.values.derived(func, args, kwargs, out, before)
        return out

    def _any_marked(self, tensors: list[Tensor]) -> bool:
        """Whether a strided meta tensor among `tensors` has a host, meta or lazily computed
        storage (device storages are not marked: the common case, answered in one pass)."""
        kinds, collated = self.kinds, self.collated
        with _NO_MODES():
            for tensor in tensors:
                if type(tensor) in _PLAIN_TENSORS:  # `is_meta`: no device object made
                    meta = tensor.is_meta
                else:  # a subclass may answer `device` itself
                    meta = tensor.device.type == "meta"
                if meta and tensor.layout == torch.strided:
                    key = id(tensor.untyped_storage())
                    if key in kinds or key in collated:
                        return True
        return False

    def _in_place(self, func, target: Tensor, args: tuple, kwargs: dict):
        try:
            out = func(*args, **kwargs)
        except (RuntimeError, NotImplementedError):  # a real host tensor argument: as meta
            with self.make(HOST):
                args, kwargs = tree_map(
                    lambda t: t.to("meta") if isinstance(t, Tensor) and self.kind(t) is None else t,
                    (args, kwargs),
                )
            out = func(*args, **kwargs)
        self.values.in_place(func, target, args, kwargs)
        return out

    # -- notes ---------------------------------------------------------------------------------
    def notes(self) -> list[str]:
        stats, reads, notes = self.stats, self.values.reads, []
        if stats.tensors:
            notes.append(
                f"{stats.tensors} host tensor(s) ({stats.bytes / 2**30:.2f} GiB) made while models "
                "were built were kept fake (no host memory) until moved to the device or read"
            )
        if self.session.max_allocated_bytes == 0 and (stats.tensors or self.session.trace):
            notes.append("the job made no device allocations (it ran on the host)")
        if reads.recomputed + reads.zeros:
            notes.append(
                f"{reads.recomputed + reads.zeros} host tensor(s) built while the model was "
                f"constructed were given placeholder values when read ({reads.recomputed} "
                "recomputed from the call that made them and the in-place inits since, random "
                f"ones with new random numbers; {reads.zeros} zeros)"
            )
        return notes


def _to_copy(tensor: Tensor, device: Any, dtype: Any, non_blocking: bool, memory_format: Any):
    kwargs: dict[str, Any] = {"copy": True, "non_blocking": bool(non_blocking)}
    if device is not None:
        kwargs["device"] = device
    if dtype is not None:
        kwargs["dtype"] = dtype
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    return TO(tensor, **kwargs)  # not a `to` the job replaced


def _cuda_device(value: Any) -> torch.device:
    if isinstance(value, int):
        return torch.device("cuda", value)
    device = torch.device(value)
    return device if device.index is not None else torch.device("cuda", 0)


def _parse_to(rest: tuple, kwargs: dict) -> tuple[Any, Any, bool, bool, Any] | None:
    """`Tensor.to`'s arguments: (device or tensor, dtype, non_blocking, copy, memory_format)."""
    rest = list(rest)
    device = kwargs.get("device")
    dtype = kwargs.get("dtype")
    if "other" in kwargs:
        device = kwargs["other"]
    if rest:
        first = rest[0]
        if isinstance(first, Tensor):
            device = rest.pop(0)
            dtype = device.dtype
        elif isinstance(first, torch.dtype):
            dtype = rest.pop(0)
        elif first is None or isinstance(first, (str, torch.device, int)):
            device = rest.pop(0)
            if rest and (rest[0] is None or isinstance(rest[0], torch.dtype)):
                dtype = rest.pop(0)
        else:
            return None
    non_blocking = rest[0] if rest else kwargs.get("non_blocking", False)
    copy = rest[1] if len(rest) > 1 else kwargs.get("copy", False)
    return device, dtype, bool(non_blocking), bool(copy), kwargs.get("memory_format")


def map_containers(fn: Callable[[Any], Any], value: Any) -> Any:
    """`fn` over the tensors in dicts, lists and tuples (keeping their types and a state dict's
    `_metadata`); other objects unchanged."""
    if isinstance(value, dict):
        try:
            mapped = type(value)()
        except TypeError:
            mapped = {}
        for key, item in value.items():
            mapped[key] = map_containers(fn, item)
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            mapped._metadata = metadata
        return mapped
    if isinstance(value, list):
        return [map_containers(fn, item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(map_containers(fn, item) for item in value)
    return fn(value)


# -- the recorder's question ---------------------------------------------------------------------
def outputs_kind(session: CaptureSession, args: tuple, kwargs: dict) -> tuple[str, str | None]:
    """What the new meta storages of an op with these arguments stand for, and the category of
    a device allocation it makes (None: the recorder's default): ("device", None) unless a
    host-deferred or meta tensor is involved."""
    deferral = session.host_deferral
    if deferral is None:
        return DEVICE, None
    if deferral.making is not None:
        return deferral.making, (Category.INPUT.value if deferral.moving else None)
    kinds = session.storage_kinds
    if not kinds:
        return DEVICE, None
    found: set[str] = set()
    # DEVICE as soon as one meta tensor is a device one (or not strided), whatever the order
    if _device_among(args, kinds, found) or (kwargs and _device_among(kwargs.values(), kinds,
                                                                      found)):
        return DEVICE, None
    if HOST in found:
        return HOST, None
    if META in found:
        return META, None
    return DEVICE, None


def _device_among(values: Any, kinds: dict[int, str], found: set[str]) -> bool:
    """Whether a meta tensor among `values` (walked as `tensors_in` walks them) is a device one
    or not strided; the kinds of the others go into `found`."""
    for value in values:
        kind = type(value)
        if kind in _PLAIN_TENSORS:
            if value.is_meta and _device_kind(value, kinds, found):
                return True
        elif kind is tuple or kind is list:
            if _device_among(value, kinds, found):
                return True
        elif kind is dict:
            if _device_among(value.values(), kinds, found):
                return True
        elif kind not in LEAF_TYPES:  # a tensor subclass, another pytree node, an object
            for tensor in tensors_in(value):
                if ((tensor.is_meta if type(tensor) in _PLAIN_TENSORS
                     else tensor.device.type == "meta")
                        and _device_kind(tensor, kinds, found)):
                    return True
    return False


def _device_kind(tensor: Tensor, kinds: dict[int, str], found: set[str]) -> bool:
    """Of a meta tensor: whether it is a device one or not strided (else its kind is found)."""
    if tensor.layout != torch.strided:
        return True
    kind = kinds.get(id(tensor.untyped_storage()), DEVICE)
    if kind == DEVICE:
        return True
    found.add(kind)
    return False


def claim(session: CaptureSession, tensor: Tensor, kind: str) -> bool:
    """Whether the recorder must not track `tensor`'s storage as device memory (a host-deferred
    or meta storage, new ones of `kind` marked here)."""
    kinds = session.storage_kinds
    if not kinds and kind == DEVICE:
        return False
    storage = tensor.untyped_storage()
    if id(storage) in kinds:
        return True
    if kind == DEVICE:
        return False
    deferral = session.host_deferral
    if deferral is not None:
        deferral.mark(tensor, kind)
    return True


@contextmanager
def host_deferral(session: CaptureSession) -> Iterator[HostDeferral]:
    """The host-deferral mode and the weight-loading patches (capture.weights_loading), for the
    job's run (entered on top of CudaAsMeta)."""
    with HostDeferral(session) as mode, deferral_patches(session, mode):
        yield mode


def _keep_loaded_values(device_tensor: Tensor, loaded: Tensor) -> None:
    """A small tensor loaded onto the device (`torch.load(map_location="cuda")`) keeps the
    file's values for host reads until it is written: a checkpoint's RNG state read back with
    `.cpu()` for `torch.set_rng_state`, a step count, a best metric (fake mode otherwise reads
    zeros, and an all-zero RNG state is refused)."""
    from peakmem.capture.device_map import (
        HOST_DATA_MAX_ELEMENTS,
        give_host_data,
        give_lazy_host_data,
    )

    with _NO_MODES():
        if loaded.numel() <= HOST_DATA_MAX_ELEMENTS:
            give_host_data(device_tensor, loaded.detach())
        else:  # a larger one (a mask, a table): read from the (memory-mapped) file if needed
            give_lazy_host_data(device_tensor, loaded.detach)


@contextmanager
def deferral_patches(session: CaptureSession, mode: HostDeferral) -> Iterator[None]:
    """The weight-loading patches and the count of meta device contexts, for `mode`."""
    from peakmem.capture.weights_loading import weights_loading

    with weights_loading(session, mode), _meta_contexts_seen(mode):
        yield


@contextmanager
def _meta_contexts_seen(mode: HostDeferral) -> Iterator[None]:
    """`with torch.device("meta")` puts a DeviceContext mode on the stack that fills in
    `device=meta` before this mode sees the call: count the calls it handles."""
    context_class = torch_device_context.DeviceContext
    original = context_class.__torch_function__

    def handle(context, func, types, args=(), kwargs=None):
        if context.device.type != "meta":
            return original(context, func, types, args, kwargs)
        mode.meta_context += 1
        try:
            return original(context, func, types, args, kwargs)
        finally:
            mode.meta_context -= 1

    context_class.__torch_function__ = handle
    try:
        yield
    finally:
        context_class.__torch_function__ = original
