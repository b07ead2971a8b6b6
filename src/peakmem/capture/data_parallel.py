"""`nn.DataParallel` over several GPUs: each GPU's memory traced as an event stream of its own.

How the job is told it has several GPUs: its environment (`CUDA_VISIBLE_DEVICES=0,1,2,3 python
train.py`, the variable in the environment peakmem runs in, or set by the job before it asks):
`torch.cuda.device_count()` answers the number of devices it leaves visible (read as torch reads
it), so `if torch.cuda.device_count() > 1: model = nn.DataParallel(model)` wraps the model over
all of them. Unset (or one device): one GPU, as before. A distributed launch's rank sees its local
world size (capture.fake_distributed), as before.

What torch does (torch/nn/parallel/data_parallel.py, replicate.py, scatter_gather.py,
_functions.py, comm.py; torch/csrc/cuda/comm.cpp), and how it is modelled:
- `scatter`: the batch is split along dim 0 (`tensor.chunk(N)`: chunks of ceil(B / N) rows, the
  last smaller, fewer chunks than devices when B < N); chunk i is copied to device i, except the
  chunk already on its device (a view: device 0's chunk of a device-0 batch; a host batch is
  copied to every device).
- `replicate` broadcasts the parameters (`Broadcast`, kept by the graph until backward) and the
  buffers to devices 1..N-1 with `broadcast_coalesced`: tensors are taken in buckets of
  `buffer_size` (10 MiB, per dtype, C++ `take_tensors`: a bucket is closed by the tensor that
  reaches the limit), each bucket is flattened on device 0 (a copy unless it holds one tensor,
  freed after its broadcast) and copied to every other device as one block, whose views are the
  replica's tensors (the block lives while any of them does). Device 0's replica is the module's
  own tensors.
- `parallel_apply` runs the replicas (here one after the other, each on its device).
- `gather` copies the outputs into one new tensor on the output device (`torch.cat`'s size).
- backward: `Gather`'s backward scatters the output gradient the same way; `Broadcast`'s backward
  (`ReduceAddCoalesced`, torch's own Python, run as it is) flattens each device's gradients per
  bucket on that device and `reduce_add`s the flat buckets into a new block on device 0, whose
  views become the parameters' gradients.
- NCCL (`broadcast`, `reduce`): one communicator per device (memory outside the allocator: the
  GPU profile's NCCL figure, on every device).

Devices: every op runs on the device of its inputs (as CUDA's device guards do) or, inside a
replica's forward and the copies above, on the device torch puts it on. The capture session's
per-device state (its trace, live storages, counters, libraries) is swapped in for the op
(`DeviceStates.dispatch`): device 0 keeps the session's own trace, so the 1-GPU path is unchanged;
each other device gets a trace of its own, estimated at the end of the capture as a process of its
own would be (context, libraries, the allocator simulation) and reported in
`CaptureResult.devices`; the job's estimate is the largest device's (estimate/api.py).

Not modelled: the copy streams a host batch's chunks are copied on (they use the default stream);
an op with no tensor input outside a replica's forward that names `cuda:k` runs on device 0.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from peakmem.capture.session import CaptureSession
from peakmem.capture.unsupported import Unsupported
from peakmem.cuda_rules.true_device import is_meta
from peakmem.trace.events import Trace

BUFFER_SIZE = 10485760
"""`broadcast_coalesced` / `reduce_add_coalesced`'s default bucket size (bytes)."""

_SWAPPED = (
    "trace", "live", "allocated_bytes", "max_allocated_bytes", "libraries", "memory",
    "_persistent", "_scratch_sizes", "_pending_accumulation", "_max_before_last_alloc",
    "_recorded", "_deferred",
)
"""The session's fields that are one device's: swapped in while an op runs on that device."""

_META_KEYS = ("gpu", "stack", "capture_torch", "mode", "job_alloc_conf", "cuda_module_loading",
              "memory_fraction")
"""Trace metadata a device's trace shares with device 0's (what its estimate reads)."""


def visible_device_count(environ: Any = None) -> int:
    """The GPUs a job sees: those CUDA_VISIBLE_DEVICES leaves visible (1 when it is unset)."""
    from peakmem.jobs.launchers import visible_devices

    value = (os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return 1
    return max(1, len(visible_devices(value)))


def _fresh_state() -> dict[str, Any]:
    return {
        "trace": Trace(), "live": {}, "allocated_bytes": 0, "max_allocated_bytes": 0,
        "libraries": {}, "memory": None, "_persistent": set(), "_scratch_sizes": {},
        "_pending_accumulation": None, "_max_before_last_alloc": 0, "_recorded": set(),
        "_deferred": [],
    }


class DeviceStates:
    """The session's per-device state for devices 1..N-1 (device 0's is the session's own) and
    which device the op being recorded runs on."""

    def __init__(self, session: CaptureSession, count: int) -> None:
        self.session = session
        self.count = count
        self.current = 0
        """The device whose state is the session's now (changed under the session's lock)."""
        self._thread = threading.local()
        self.states: dict[int, dict[str, Any]] = {0: {}}
        self.lives: dict[int, dict] = {0: session.live}
        for index in range(1, count):
            state = self.states[index] = _fresh_state()
            self.lives[index] = state["live"]
        self.used: set[int] = set()
        """Devices other than 0 that held memory."""

    # -- which device -------------------------------------------------------------------------
    def index_of(self, tensor: Tensor) -> int:
        """The device a meta tensor's storage was allocated on (0 unless another one's)."""
        try:
            key = id(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError, TypeError):
            return 0
        for index in range(1, self.count):
            if key in self.lives[index]:
                return index
        return 0

    @property
    def explicit(self) -> int | None:
        """The device torch runs this thread's code on (a replica's forward, a copy: its
        `torch.cuda.device(k)`), else None: each op on the device of its inputs."""
        return getattr(self._thread, "device", None)

    def device_for(self, args: tuple, kwargs: dict) -> int:
        explicit = getattr(self._thread, "device", None)
        if explicit is not None:
            return explicit
        lives = self.lives
        if not any(lives[index] for index in range(1, self.count)):
            return 0  # no memory on another device yet
        from torch.utils._pytree import tree_leaves

        for value in tree_leaves((args, kwargs)):
            if type(value) in (Tensor, torch.nn.Parameter) and value.is_meta:
                index = self.index_of(value)
                if index:
                    return index
        return 0

    # -- swapping -----------------------------------------------------------------------------
    def activate(self, index: int) -> None:
        if index == self.current:
            return
        session = self.session
        collecting = gc.isenabled()
        gc.disable()  # a storage freed by the collector mid-swap would meet half of each state
        try:
            self.states[self.current] = {name: getattr(session, name) for name in _SWAPPED}
            for name, value in self.states[index].items():
                setattr(session, name, value)
            self.current = index
        finally:
            if collecting:
                gc.enable()
        if index:
            self.used.add(index)

    @contextmanager
    def on(self, index: int) -> Iterator[None]:
        """Device `index`'s state is the session's for the duration (the lock held: another
        thread's op waits, as it would for the session's own bookkeeping)."""
        with self.session._lock:
            previous = self.current
            self.activate(index)
            try:
                yield
            finally:
                self.activate(previous)

    @contextmanager
    def running_on(self, index: int) -> Iterator[None]:
        """Code torch runs on device `index` (a replica's forward, a copy to that device)."""
        previous = getattr(self._thread, "device", None)
        self._thread.device = index
        try:
            yield
        finally:
            self._thread.device = previous

    def dispatch(self, body: Any, func: Any, args: tuple, kwargs: dict) -> Any:
        """The recorder's op on its device."""
        with self.session._lock:
            index = self.device_for(args, kwargs)
            if index == self.current:
                return body(func, args, kwargs)
            with self.on(index):
                return body(func, args, kwargs)

    def died_elsewhere(self, key: int) -> bool:
        """A storage of another device than the current one died: free it on its device."""
        for index, live in self.lives.items():
            if index != self.current and key in live:
                with self.on(index):
                    self.session._storage_died(key)
                return True
        return False

    # -- the end ------------------------------------------------------------------------------
    def device_traces(self) -> dict[int, tuple[Trace, dict[str, int]]]:
        """Device -> (its trace, its libraries) for the devices other than 0 that held memory."""
        self.activate(0)
        meta = self.session.trace.meta
        found = {}
        for index in sorted(self.used):
            state = self.states[index]
            trace = state["trace"]
            trace.meta.update({key: meta[key] for key in _META_KEYS if key in meta})
            found[index] = (trace, dict(state["libraries"]))
        return found


def states_of(session: CaptureSession, count: int) -> DeviceStates:
    """The session's device states, made on first use."""
    devices = session.devices
    if devices is None:
        devices = session.devices = DeviceStates(session, count)
    elif devices.count < count:
        raise ValueError(f"{count} devices, the capture has {devices.count}")
    return devices


# -- the comm primitives --------------------------------------------------------------------------


def _index(device: Any) -> int:
    from torch._utils import _get_device_index

    return _get_device_index(device, True)


_SCALAR_TYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64, torch.complex32, torch.complex64, torch.complex128,
                 torch.bool, torch.qint8, torch.quint8, torch.qint32, torch.bfloat16)
_TYPE_ORDER = {dtype: number for number, dtype in enumerate(_SCALAR_TYPES)}
"""c10's ScalarType numbers: C++ `take_tensors` keeps its open groups in a map by type id."""


def _take_tensors(tensors: list[Tensor], limit: int) -> list[list[int]]:
    """C++ `torch::utils::take_tensors` (not fine-grained) as index lists: per dtype, a bucket is
    closed by the tensor that makes it reach `limit`; the open buckets follow, by dtype number."""
    results: list[list[int]] = []
    groups: dict[Any, list[Any]] = {}
    for position, tensor in enumerate(tensors):
        group = groups.setdefault(tensor.dtype, [[], 0])
        group[0].append(position)
        group[1] += tensor.numel() * tensor.element_size()
        if group[1] >= limit:
            results.append(group[0])
            groups[tensor.dtype] = [[], 0]
    rest = sorted(groups.items(), key=lambda item: _TYPE_ORDER.get(item[0], len(_TYPE_ORDER)))
    results.extend(group[0] for _dtype, group in rest if group[0])
    return results


def _copy_to(states: DeviceStates, index: int, tensor: Tensor,
             category: str | None = None) -> Tensor:
    """`tensor` copied to device `index` (a block of its own there, tagged `category`)."""
    with states.running_on(index):
        if not is_meta(tensor):  # a host tensor: the copy to the device
            copy = tensor.to("cuda")
        else:
            copy = tensor.clone(memory_format=torch.preserve_format)
    if category is not None:
        with states.on(index):
            states.session.classify(copy, category)
    return copy


def _nccl(states: DeviceStates, indices: Any) -> None:
    """A NCCL collective over `indices`: each device has its communicator (memory outside the
    allocator, the GPU profile's figure)."""
    from peakmem.capture.fake_distributed import NCCL_FAMILY

    session = states.session
    each = int(session.stack.library_bytes_for(session.gpu, NCCL_FAMILY).value)
    for index in set(indices):
        with states.on(index):
            session.libraries.setdefault(NCCL_FAMILY, each)


def _indices(states: DeviceStates, devices: Any) -> list[int]:
    from peakmem.capture.device_ordinals import check_ordinal

    indices = [_index(device) for device in devices]
    for index in indices:
        check_ordinal(index)
        if index >= states.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{index}: the job sees "
                               f"{states.count} GPUs)")
    return indices


def broadcast_coalesced(states: DeviceStates, tensors: Any, devices: Any,
                        buffer_size: int = BUFFER_SIZE) -> list:
    """`torch.nn.parallel.comm.broadcast_coalesced` (C++ `broadcast_coalesced`)."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    tensors = list(tensors)
    indices = _indices(states, devices)
    outputs: list[list[Any]] = [list(tensors)] + [[None] * len(tensors) for _ in indices[1:]]
    if len(indices) > 1 and tensors:
        _nccl(states, indices)
    for bucket in _take_tensors(tensors, buffer_size):
        chunk = [tensors[i] for i in bucket]
        with states.running_on(indices[0]):
            flat = _flatten_dense_tensors(chunk)
        # the replica's parameters or buffers (a bucket holds one or the other)
        category = "parameter" if isinstance(chunk[0], torch.nn.Parameter) else "buffer"
        for slot, index in enumerate(indices[1:], start=1):
            copy = _copy_to(states, index, flat, category)
            with states.running_on(index):
                views = _unflatten_dense_tensors(copy, chunk)
                for position, view in zip(bucket, views, strict=True):
                    outputs[slot][position] = view.detach()
            del copy, views
        del flat
    return outputs


def broadcast(states: DeviceStates, tensor: Tensor, devices: Any = None, *,
              out: Any = None) -> tuple:
    """`torch.nn.parallel.comm.broadcast`: the tensor itself on its device, a copy on the
    others."""
    if out is not None or devices is None:
        raise Unsupported("torch.cuda.comm.broadcast with out=")
    indices = _indices(states, devices)
    source = states.index_of(tensor)
    return tuple(tensor if index == source else _copy_to(states, index, tensor)
                 for index in indices)


def scatter(states: DeviceStates, tensor: Tensor, devices: Any = None, chunk_sizes: Any = None,
            dim: int = 0, streams: Any = None, *, out: Any = None) -> tuple:
    """`torch.nn.parallel.comm.scatter` (C++ `scatter`): chunks (`chunk_sizes`, else
    `tensor.chunk(len(devices))`), each copied to its device unless already there (a host
    tensor's chunks are all copied)."""
    if out is not None or devices is None:
        raise Unsupported("torch.cuda.comm.scatter with out=")
    indices = _indices(states, devices)
    if chunk_sizes is not None:
        chunks = tensor.split_with_sizes(list(chunk_sizes), dim)
    else:
        chunks = tensor.chunk(len(indices), dim)
    source = states.index_of(tensor) if is_meta(tensor) else -1
    # the batch's chunks are the replicas' input (in backward: the output gradient's chunks)
    category = None if states.session.in_backward else "input"
    return tuple(chunk if index == source else _copy_to(states, index, chunk, category)
                 for chunk, index in zip(chunks, indices, strict=False))


def gather(states: DeviceStates, tensors: Any, dim: int = 0, destination: Any = None, *,
           out: Any = None) -> Tensor:
    """`torch.nn.parallel.comm.gather` (C++ `gather`): one new tensor on the destination."""
    if out is not None:
        raise Unsupported("torch.cuda.comm.gather with out=")
    tensors = list(tensors)
    if destination == "cpu" or destination == -1:
        return torch.cat([t.cpu() for t in tensors], dim)
    index = _indices(states, [0 if destination is None else destination])[0]
    with states.running_on(index):
        return torch.cat(tensors, dim)


def reduce_add(states: DeviceStates, inputs: Any, destination: Any = None) -> Tensor:
    """`torch.nn.parallel.comm.reduce_add` (NCCL's path): a new tensor on the destination, the
    size of one input."""
    inputs = list(inputs)
    index = _indices(states, [0 if destination is None else destination])[0]
    where = [states.index_of(t) for t in inputs]
    if index not in where:
        raise RuntimeError(
            "reduce_add expects destination to be on the same GPU with one of the tensors")
    root = inputs[where.index(index)]
    if len(inputs) == 1:
        return root
    _nccl(states, where)
    with states.running_on(index):  # the sum in one new block (in place: no other allocation)
        result = torch.empty_like(root).copy_(root)
        for tensor in inputs:
            if tensor is not root:
                result.add_(tensor)
        return result


def parallel_apply(states: DeviceStates, data_parallel: Any, replicas: Any, inputs: Any,
                   kwargs: Any) -> list:
    """`DataParallel.parallel_apply`: each replica's forward on its device (one after the
    other: each device's allocations are its own, so the order between devices is free)."""
    devices = _indices(states, data_parallel.device_ids[: len(replicas)])
    if kwargs is None:
        kwargs = ({},) * len(replicas)
    outputs = []
    for module, args, kw, index in zip(replicas, inputs, kwargs, devices, strict=False):
        if not isinstance(args, (list, tuple)):
            args = (args,)
        with states.running_on(index):
            outputs.append(module(*args, **(kw or {})))
    return outputs


def parallel_apply_function(states: DeviceStates, modules: Any, inputs: Any,
                            kwargs_tup: Any = None, devices: Any = None) -> list:
    """`torch.nn.parallel.parallel_apply` (the functional `data_parallel` calls it): as
    `DataParallel.parallel_apply`, on `devices` (default: each input's device, else 0..)."""
    if devices is None:
        devices = [_first_device(states, args, position) for position, args in enumerate(inputs)]
    owner = type("Replicas", (), {"device_ids": list(devices)})()
    return parallel_apply(states, owner, modules, inputs, kwargs_tup)


def _first_device(states: DeviceStates, args: Any, position: int) -> int:
    from torch.utils._pytree import tree_leaves

    for value in tree_leaves(args):
        if isinstance(value, Tensor) and is_meta(value):
            return states.index_of(value)
    return position


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    """The devices the job sees, and DataParallel's primitives over them."""
    from torch.nn.parallel import _functions, comm

    def device_count() -> int:
        # read when asked, as torch does before CUDA starts (a job may set the variable itself)
        return visible_device_count()

    def bound(function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            # the device states are made on first use: until then every op is device 0's
            count = max(torch.cuda.device_count(), 1)  # a rank's: its local world size
            return function(states_of(session, count), *args, **kwargs)

        call.__name__ = call.__qualname__ = function.__name__
        call.__doc__ = function.__doc__
        return call

    found: dict[tuple[Any, str], Any] = {
        # a distributed launch's rank sees its local world size instead (fake_distributed)
        (torch.cuda, "device_count"): device_count,
        (torch.accelerator, "device_count"): device_count,
        # the host batch's chunks are copied on the default stream (copy streams not modelled)
        (_functions, "_get_stream"): lambda device: None,
        (torch.nn.DataParallel, "parallel_apply"): bound(parallel_apply),
    }
    import importlib

    function = bound(parallel_apply_function)
    # `torch.nn.parallel.parallel_apply` is the function: its module is found by name
    for name in ("torch.nn.parallel", "torch.nn.parallel.data_parallel",
                 "torch.nn.parallel.parallel_apply"):
        found[(importlib.import_module(name), "parallel_apply")] = function
    import torch.cuda.comm as cuda_comm  # its names are bound from nn.parallel.comm

    for function in (broadcast_coalesced, broadcast, scatter, gather, reduce_add):
        found[(comm, function.__name__)] = found[(cuda_comm, function.__name__)] = bound(function)
    return found


# -- each device's estimate ------------------------------------------------------------------------

def device_reports(session: CaptureSession, result: Any,
                   traces: dict[int, tuple[Trace, dict[str, int]]]) -> list[dict[str, Any]]:
    """Each device other than 0 that held memory (`DeviceStates.device_traces`), estimated as
    the job's estimate is (its CUDA context, its libraries, its trace through the allocator
    simulation)."""
    from peakmem.capture.fake_memory import target_settings
    from peakmem.capture.result import CaptureResult
    from peakmem.estimate.api import estimate_capture

    conf, version = target_settings("{}.{}".format(*session.stack.torch_min))
    reports = []
    for index, (trace, libraries) in traces.items():
        capture = CaptureResult(
            trace=trace, steps=result.steps, stopped=result.stopped,
            forward_calls=result.forward_calls, seconds=0.0, mode=result.mode,
            libraries=libraries, backward_passes=result.backward_passes,
        )
        estimate = estimate_capture(capture, session.gpu, session.stack, torch_version=version,
                                    alloc_conf=conf, mode=result.mode)
        reports.append({
            "device": index,
            "peak_bytes": int(estimate.peak_bytes),
            "context_bytes": int(estimate.context_bytes),
            "library_bytes": int(estimate.library_bytes),
            "peak_reserved_bytes": int(estimate.peak_reserved_bytes),
            "peak_allocated_bytes": int(estimate.peak_allocated_bytes),
            "breakdown": {str(k): int(v) for k, v in estimate.breakdown.by_category.items()},
        })
    return reports
