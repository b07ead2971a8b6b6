"""A torch-function mode that puts "cuda" tensors on the meta device (no memory, no compute),
keeps host tensors real, answers host reads of device tensors (`.item()`, `.tolist()`,
`.cpu()`, printing with a format) with placeholder zeros (eager mode: their real values), and
hands calls that CUDA dispatches differently to the CUDA function rules.

The job sees device tensors as `cuda:0` tensors: tensor attributes the capture answers for the job
(`.device`, `.is_cuda`, `.data = ...`, ...) are looked up in `capture.tensor_overrides`
(capture/device_view.py, capture/module_apply.py)."""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map

from peakmem.capture import (  # noqa: F401  (their registrations)
    device_view,
    einsum_path,
    module_apply,
    slice_bounds,
)
from peakmem.capture.arg_tensors import tensors_in
from peakmem.capture.backward_view import job_view_in_backward, job_view_in_saved_tensor_hooks
from peakmem.capture.device_ordinals import check_device_spec
from peakmem.capture.device_specs import is_cuda_spec, is_host_spec
from peakmem.capture.fake_tensors import job_default_is_device, mark_pinned
from peakmem.capture.grad_accumulation import backward_roots, engine_marked
from peakmem.capture.known_values import KNOWN_VALUE_OPS, call_carrying_values
from peakmem.capture.phases import PhaseTracker
from peakmem.capture.replaced_methods import ORIGINAL, canonical
from peakmem.capture.session import CaptureSession
from peakmem.capture.tensor_overrides import TENSOR_OVERRIDES
from peakmem.cuda_rules import FUNCTION_RULES
from peakmem.cuda_rules.true_device import is_meta

CAPTURE_DEVICE = torch.device("meta")
TO = ORIGINAL["to"]
"""`Tensor.to` as peakmem found it: `.cuda()` moves with it, not with a `to` the job replaced."""
Tensor = torch.Tensor

# Tensor methods that read device memory into Python or host memory.
_HOST_READS = {
    Tensor.item,
    Tensor.tolist,
    Tensor.numpy,
    Tensor.__float__,
    Tensor.__int__,
    Tensor.__bool__,
    Tensor.__index__,
    Tensor.__complex__,
    Tensor.__format__,
    Tensor.__array__,
    # `value in t` (Python code: `(value == t).any().item()`, run below the capture's mode, so
    # its `.item()` would reach the meta kernel): read on the host as a whole, known values
    # where the device tensor has them (transformers' `pad_token_id in input_ids[:, [-1, 0]]`)
    Tensor.__contains__,
    # a bool on the host (torchmetrics' MetricCollection compares its metrics' states with
    # `torch.allclose` to merge compute groups)
    torch.allclose,
    Tensor.allclose,
    torch.equal,
    Tensor.equal,
}
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
# Validity checks whose result a job reads only to raise when it is False (torch.distributions'
# argument validation, `torch._check_tensor_all`): with no values to check, fake mode reads True.
_ALL_TRUE_CHECKS = {torch._is_all_true, Tensor._is_all_true}
_ASSUMED_TRUE = "_peakmem_assumed_true"
_HOST_DATA = "_peakmem_host_data"
"""On a device tensor built from host data (`torch.tensor(data, device="cuda")`): (the host
tensor it was copied from, the device tensor's version counter then)."""
HOST_DATA_MAX_ELEMENTS = 1 << 16
"""Device tensors built from host data up to this size keep their host values for host reads."""
_FLAT_LEAVES = frozenset({Tensor, torch.nn.Parameter, str, int, float, bool, type(None)})
"""Argument types that are pytree leaves (a host read's `(tensor,)`, `(tensor, ".3f")`)."""
_BACKWARD_CALLS = {Tensor.backward, torch.autograd.backward, torch.autograd.grad}
_OWN_BRANCHES = frozenset({
    *_HOST_READS, *_FROM_DATA, *_ALL_TRUE_CHECKS, *_BACKWARD_CALLS,
    Tensor.to, Tensor.cuda, Tensor.cpu, Tensor.copy_, *KNOWN_VALUE_OPS,
})
"""The functions `CudaAsMeta.__torch_function__` has a branch of its own for (besides the
registries `TENSOR_OVERRIDES` and `FUNCTION_RULES`, looked up on every call)."""


def to_capture_device(value: Any, *, ints: bool = False) -> Any:
    """Map a CUDA device spec to the capture device; anything else unchanged."""
    return CAPTURE_DEVICE if is_cuda_spec(value, ints=ints) else value


def gpu_index(value: Any) -> int | None:
    """The ordinal a CUDA device spec names (`cuda:1`, `torch.device("cuda", 1)`, `1`), or
    None (no index: the current device, or not a GPU)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.startswith("cuda:"):
        index = value[len("cuda:"):]
        return int(index) if index.isdigit() else None
    if isinstance(value, torch.device) and value.type == "cuda":
        return value.index
    return None


def note_other_gpu(session: CaptureSession, value: Any) -> None:
    """A tensor put on a GPU other than the process's current one (`cuda:1` beside `cuda:0`:
    model parallelism in one process): peakmem models one GPU per process, so the note says
    that their allocations were counted together. An ordinal the job has no GPU of raises as
    on CUDA (capture.device_ordinals)."""
    check_device_spec(value)
    index = gpu_index(value)
    if index is None:
        return
    current = torch.cuda.current_device()  # the fake runtime's (a rank's own under a launcher)
    if index == current:
        return
    devices = session.devices
    if devices is not None and devices.explicit == index:
        return  # DataParallel's replica on that device: its allocations are its own there
    note = (f"the job put tensors on cuda:{index} besides its current device cuda:{current}: "
            "peakmem models one GPU per process, so the allocations on every GPU were counted "
            "together as one GPU's (an over-estimate of each GPU's peak)")
    prefix = note.split(" besides", 1)[0]
    if not any(existing.startswith(prefix) for existing in session.notes):
        session.notes.append(note)


_HOST_ZEROS = torch.zeros
"""torch's own `zeros`, kept before the job runs: a job may replace `torch.zeros` while it runs
(`deepspeed.zero.Init()` wraps the factories to make device tensors of its dtype), and a
placeholder is a host tensor of the device tensor's dtype whatever the job set."""
_HOST_ONES = torch.ones


def placeholder(tensor: Any) -> Any:
    """A real host tensor standing in for a device tensor's unknown values: zeros, but a
    boolean mask (one dimension or more) reads all True, as fake mode sizes a selection on the
    device (every element selected, capture.recorder): a mask read on the host selects there
    (TRL's GRPO cuts each completion with `c[m].tolist()` for `m` from
    `completion_mask.bool().cpu()`), and an all-False one would select nothing, where the
    GPU run selects something (and the job fails on an empty selection, or allocates less). A
    0-d boolean (a condition: `if torch.isnan(loss):`) still reads False."""
    if is_meta(tensor):
        if tensor.dtype == torch.bool and tensor.dim() > 0:
            return _HOST_ONES(tensor.shape, dtype=torch.bool, device="cpu")
        return _HOST_ZEROS(tensor.shape, dtype=tensor.dtype, device="cpu")
    return tensor


def host_copy(known: Tensor) -> Tensor:
    """A host copy of a device tensor's known values, as the job gets it (capture.side_effects
    notes it, as it notes placeholders: a save of it holds device data and is diverted)."""
    return known


def _known_host_data(tensor: Tensor) -> Tensor | None:
    """The values of a device tensor built from host data (or of a view of one), while no
    in-place op has written to it (views share their base's version counter); else None."""
    base = tensor if tensor._base is None else tensor._base
    known = getattr(base, _HOST_DATA, None)
    if known is None or known[1] != _version(tensor):
        return None
    host = known[0]
    if callable(host):  # a loaded tensor's values, read from its file when first needed
        host = _read_lazily(base, known)
        if host is None:
            return None
    if base is tensor:
        return host.clone()
    if tensor.dtype != host.dtype:
        return None  # a reinterpreting view (`.view(dtype)`)
    return torch.as_strided(host, tensor.size(), tensor.stride(), tensor.storage_offset()).clone()


def known_host_data(tensor: Tensor) -> Tensor | None:
    """A device tensor's host values where they are known (see `_known_host_data`); a validity
    check's result assumed to pass (`_ASSUMED_TRUE`) is known to be all True."""
    if not is_meta(tensor):
        return None
    if getattr(tensor, _ASSUMED_TRUE, False):
        return torch.ones(tensor.shape, dtype=tensor.dtype)
    return _known_host_data(tensor)


def give_host_data(tensor: Tensor, host: Tensor) -> None:
    """`tensor` (a device tensor, no view) holds `host`'s values from now until an in-place
    op writes to it: what a collective delivered into it (capture.fake_distributed)."""
    if is_meta(tensor) and tensor._base is None and host.numel() == tensor.numel() \
            and host.numel() <= HOST_DATA_MAX_ELEMENTS:
        setattr(tensor, _HOST_DATA, (host.reshape(tensor.shape).to(tensor.dtype), _version(tensor)))


LOADED_VALUES_MAX_BYTES = 64 << 20
"""A device tensor loaded from a checkpoint (torch.load, safetensors) with more elements than
HOST_DATA_MAX_ELEMENTS keeps its values lazily, up to this many bytes: read from the file when
the job first reads it on the host, then kept with the tensor (until an in-place write)."""


def give_lazy_host_data(tensor: Tensor, read: Any) -> None:
    """`tensor` (a device tensor, no view) holds the values `read()` returns (a host tensor of
    its numel, read when first needed) until an in-place op writes to it: a large loaded
    tensor (up to LOADED_VALUES_MAX_BYTES)."""
    if is_meta(tensor) and tensor._base is None \
            and tensor.numel() * tensor.element_size() <= LOADED_VALUES_MAX_BYTES:
        setattr(tensor, _HOST_DATA, (read, _version(tensor)))


def _read_lazily(base: Tensor, known: tuple) -> Tensor | None:
    """The values a lazy reader gives (kept in its place: read once), or None when they cannot
    be read or do not fit the tensor."""
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            host = known[0]()
            if host is None or host.numel() != base.numel():
                return None
            host = host.detach().reshape(base.shape).to(base.dtype, copy=True)
    except Exception:  # noqa: BLE001 - an unreadable file: the values stay unknown
        return None
    setattr(base, _HOST_DATA, (host, known[1]))
    return host


def _version(tensor: Tensor) -> int | None:
    """The tensor's version counter; None for an inference tensor (made under
    `torch.inference_mode`, as Lightning's validate / test / predict make theirs), which has
    none: its in-place writes are not seen, and its host data is kept as it was made."""
    return None if tensor.is_inference() else tensor._version


def _has_device_tensor(args: tuple, kwargs: dict) -> bool:
    return any(is_meta(t) for t in tensors_in((args, kwargs)))


def _copies_device_to_host(args: tuple, kwargs: dict) -> bool:
    """`host.copy_(device_tensor)`: a device-to-host copy (no meta kernel copies across)."""
    source = args[1] if len(args) > 1 else kwargs.get("src")
    return (len(args) > 0 and isinstance(args[0], Tensor) and not is_meta(args[0])
            and isinstance(source, Tensor) and is_meta(source))


class CudaAsMeta(TorchFunctionMode):
    def __init__(self, session: CaptureSession, phases: PhaseTracker) -> None:
        super().__init__()
        self.session = session
        self.phases = phases
        self._entered = 0
        self._hooks = ExitStack()

    def open(self) -> None:
        """What entering the mode sets up besides pushing it (the first entry: the saved-tensor
        hooks' job view); `capture_modes.CaptureModes` opens it without pushing it."""
        if self._entered == 0:
            self._hooks.enter_context(job_view_in_saved_tensor_hooks(self))
        self._entered += 1

    def close(self) -> None:
        self._entered -= 1
        if self._entered == 0:
            self._hooks.close()

    def __enter__(self):
        self.open()
        return super().__enter__()

    def __exit__(self, *exc):
        self.close()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        func = canonical(func)  # a Tensor method the job replaced: the original's call
        if func in KNOWN_VALUE_OPS and self.session.host_value is None:
            # fake mode: known host values carried through cheap ops (capture.known_values)
            kwargs = dict(kwargs or {})
            return call_carrying_values(
                func, args, kwargs, lambda call_args: self._dispatch(func, call_args, dict(kwargs))
            )
        return self._dispatch(func, args, kwargs)

    def _dispatch(self, func, args: tuple, kwargs: dict | None):
        if (func not in _OWN_BRANCHES and func not in TENSOR_OVERRIDES
                and func not in FUNCTION_RULES):
            # the common call: no branch below applies unless a device or pinned memory is named
            if not kwargs:
                return func(*args)
            if "device" not in kwargs and not kwargs.get("pin_memory"):
                return func(*args, **kwargs)
        kwargs = dict(kwargs or {})
        override = TENSOR_OVERRIDES.get(func)
        if override is not None:
            return override(self, func, args, kwargs)
        if "device" in kwargs:
            note_other_gpu(self.session, kwargs["device"])
            kwargs["device"] = to_capture_device(kwargs["device"], ints=True)
        if kwargs.get("pin_memory") and kwargs.get("device") != CAPTURE_DEVICE:
            # Pinned host memory is not device memory, and a CPU-only torch has no pinned
            # allocator: the tensor is made in ordinary host memory, and says it is pinned.
            del kwargs["pin_memory"]
            return mark_pinned(func(*args, **kwargs))

        if func in _FROM_DATA and "device" not in kwargs and job_default_is_device(self.session):
            kwargs["device"] = CAPTURE_DEVICE  # `torch.set_default_device("cuda")`: data to the device
        if func in _FROM_DATA and (kwargs.get("device") == CAPTURE_DEVICE
                                   or _has_device_tensor(args, {})):
            return self._from_data(func, args, kwargs)
        if func is ORIGINAL["to"]:
            return self._to(args, kwargs)
        if func is ORIGINAL["cuda"]:
            note_other_gpu(self.session, args[1] if len(args) > 1 else kwargs.get("device"))
            moved = TO(args[0], CAPTURE_DEVICE, non_blocking=kwargs.get("non_blocking", False))
            if args[0].layout == torch.sparse_coo and not is_meta(args[0]):
                return _sparse_with_its_entries(args[0], moved)
            return _keeps_host_data(args[0], moved)
        if func is ORIGINAL["cpu"] and is_meta(args[0]):
            _no_graph_capture(self.session)
            return self._host(args[0])
        if func is ORIGINAL["copy_"] and _copies_device_to_host(args, kwargs):
            _no_graph_capture(self.session)
            return self._copy_to_host(args, kwargs)
        if func in _HOST_READS and _has_device_tensor(args, kwargs):
            _no_graph_capture(self.session)
            if not kwargs and all(type(arg) in _FLAT_LEAVES for arg in args):
                return func(*[self._host(arg) for arg in args])  # tree_map's leaves, in order
            return func(*tree_map(self._host, args), **tree_map(self._host, kwargs))
        if func in _ALL_TRUE_CHECKS and _has_device_tensor(args, kwargs):
            result = func(*args, **kwargs)
            if is_meta(result):
                setattr(result, _ASSUMED_TRUE, True)
            return result
        if func in _BACKWARD_CALLS:
            # The job's code that runs in backward (hooks, checkpoint recomputation, custom
            # autograd functions) sees the device view and the function rules, as in forward.
            # A backward call made inside backward (reentrant checkpointing) stays in that phase.
            phase = nullcontext() if self.session.in_backward else self.phases.backward()
            with phase, job_view_in_backward(self), engine_marked(backward_roots(func, args, kwargs)):
                return func(*args, **kwargs)
        rule = FUNCTION_RULES.get(func)
        if rule is not None and _has_device_tensor(args, kwargs):
            result = rule(self.session, func, args, kwargs)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)

    def _from_data(self, func, args: tuple, kwargs: dict):
        """`torch.tensor(data, device="cuda")`: built on the host and copied to the device, as
        CUDA does (meta would build it out of the recorder's sight, with no values). Device
        scalars inside the data (`torch.tensor([t1, t2], device=t1.device)`, torchtune's Llama 3
        RoPE scaling) are read on the host first, as CUDA reads them (host reads: placeholder
        zeros in fake mode, real values in eager mode); without a device the result stays on
        the host, as it does on CUDA. Built from host data only (up to
        HOST_DATA_MAX_ELEMENTS), the device tensor keeps that data: host reads of it before
        any in-place write give those values, not zeros (accelerate's `pad_across_processes`
        reads `torch.tensor(t.shape, device=t.device)` back to size its padding)."""
        if args and isinstance(args[0], Tensor):
            return func(*args, **kwargs)
        reads_before = self.session.host_reads
        args = tree_map(self._host, args)
        to_device = kwargs.get("device") == CAPTURE_DEVICE
        if not to_device:
            return func(*args, **kwargs)
        kwargs.pop("device")
        requires_grad = kwargs.pop("requires_grad", False)
        host = func(*args, device="cpu", **kwargs)  # not the job's default device (meta)
        tensor = host.to(CAPTURE_DEVICE)
        if requires_grad:
            tensor.requires_grad_()
        if reads_before == self.session.host_reads:
            give_host_data(tensor, host)
        return tensor

    def _copy_to_host(self, args: tuple, kwargs: dict):
        """`host.copy_(device_tensor)`: the host tensor gets the device tensor's values (a host
        read: zeros in fake mode, real values in eager mode); nothing is allocated on the
        device."""
        destination = args[0]
        source = args[1] if len(args) > 1 else kwargs["src"]
        return destination.copy_(self._host(source))

    def host_values(self, value: Any) -> Any:
        """A host tensor with a device tensor's values: real ones in eager mode, else zeros
        (counted as a host read that saw zeros)."""
        return self._host(value)

    def _host(self, value: Any) -> Any:
        """A host tensor with a device tensor's values: real ones in eager mode, else zeros."""
        if not is_meta(value):
            return value
        if self.session.host_value is not None:
            return self.session.host_value(value)
        if getattr(value, _ASSUMED_TRUE, False):
            return torch.ones(value.shape, dtype=value.dtype, device="cpu")  # a check: it passed
        if value.layout == torch.sparse_coo:  # its indices and values, each read back
            return torch.sparse_coo_tensor(self._host(value._indices()), self._host(value._values()),
                                           value.shape, is_coalesced=False)
        known = _known_host_data(value)
        if known is not None:
            return host_copy(known)
        self.session.host_reads += 1
        if self.session.state.forward_calls == 0:
            self.session.host_reads_before_forward += 1
        return placeholder(value)

    def _to(self, args: tuple, kwargs: dict):
        tensor, rest = args[0], list(args[1:])
        if rest:
            note_other_gpu(self.session, rest[0])
            rest[0] = to_capture_device(rest[0], ints=True)
        target = kwargs.get("device", rest[0] if rest else None)
        if is_meta(tensor) and is_host_spec(target):
            host = self._host(tensor)
            kwargs.pop("device", None)
            if rest and is_host_spec(rest[0]):
                rest = rest[1:]
            # the host device stays named: `nn.Module.to(device="cpu")` converts each tensor
            # with `t.to(device, None, non_blocking)`, whose dtype None only the device form takes
            return host.to("cpu", *rest, **kwargs) if (rest or kwargs) else host
        moved = TO(tensor, *rest, **kwargs)  # not a `to` the job replaced
        if tensor.layout == torch.sparse_coo and not is_meta(tensor) and is_meta(moved):
            return _sparse_with_its_entries(tensor, moved)
        return _keeps_host_data(tensor, moved)


def _keeps_host_data(host: Tensor, moved: Tensor) -> Tensor:
    """A small host tensor copied to the device (`t.to("cuda")`) keeps its values there, as
    `torch.tensor(data, device=...)` does: reading it back before any in-place write gives
    them, not zeros (accelerate's `synchronize_rng_state`: a generator's state copied to the
    device, broadcast from rank 0 and copied back to `set_state`). Not parameters (a model
    moved to the device would keep a host copy of each small one). The copy is peakmem's, not
    the job's: made below the capture's modes, so no host op of the job is recorded for it (the
    utilization record's host ops and bytes stay those of the job). Plain tensors only: a
    subclass's own dispatch (torchao's low-bit optimizer states) need not implement the copy."""
    if (type(host) is Tensor and is_meta(moved) and not is_meta(host) and not host.requires_grad
            and host.layout == torch.strided
            and moved.layout == torch.strided and host.numel() <= HOST_DATA_MAX_ELEMENTS
            and not host.is_complex()):
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            give_host_data(moved, host.detach().clone())
    return moved


GRAPH_CAPTURE_HOST_READ = ("CUDA error: operation not permitted when stream is capturing (a host "
                           "read of a device tensor inside a CUDA graph capture: .item(), "
                           ".tolist(), .cpu(), printing)")


def _no_graph_capture(session: CaptureSession) -> None:
    """A host read of a device tensor syncs the stream: CUDA refuses it while a graph captures
    (cudaErrorStreamCaptureUnsupported), so the job fails as it would on the GPU."""
    if session.graph_captures:
        raise RuntimeError(GRAPH_CAPTURE_HOST_READ)


def _sparse_with_its_entries(host: Tensor, moved: Tensor) -> Tensor:
    """A host sparse COO tensor moved to the device: torch's `to("meta")` of a sparse tensor
    keeps its shape but drops its entries (nnz 0), so a graph's adjacency moved to the GPU took
    no device memory. CUDA copies its indices and values: so does the capture."""
    if moved._nnz() == host._nnz():
        return moved
    result = torch.sparse_coo_tensor(
        host._indices().to(moved.device), host._values().to(device=moved.device, dtype=moved.dtype),
        host.shape, is_coalesced=host.is_coalesced(),
    )
    return result.requires_grad_(moved.requires_grad)
