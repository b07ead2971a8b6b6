"""The state of one capture: the trace being written, which fake device storages are live, and
what each one is known to hold. The recorder, the phase tracker and the CUDA rules all write here.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from peakmem.capture.oom_handlers import oom_handler_on_stack
from peakmem.capture.oom_retry import near_capacity, retry_loop_on_stack
from peakmem.capture.storage_size import check_storage_size
from peakmem.capture.subclass_storages import inner_tensors, is_wrapper
from peakmem.cuda_rules.true_device import is_meta
from peakmem.profiles import GpuProfile, StackProfile
from peakmem.trace.events import ALLOC_KINDS, Tag, Trace
from peakmem.trace.vocab import Category, Phase

# the enum values read on every op (an Enum member's `.value` is a Python descriptor call)
_BACKWARD = Phase.BACKWARD.value
_OTHER_PHASE = Phase.OTHER.value
_EVAL_PHASE = Phase.EVAL.value
_OTHER = Category.OTHER.value
_TEMPORARY = Category.TEMPORARY.value
_ACTIVATION = Category.ACTIVATION.value

DEVICE_STREAM = 0


def sparse_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The strided tensors holding a sparse tensor's memory (indices, values)."""
    layout = tensor.layout
    if layout == torch.sparse_coo:
        return [tensor._indices(), tensor._values()]
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    return []


_NO_TAG = Tag()


class LiveStorage:
    """A live device storage: its ALLOC event's index in the trace, its id there, its size."""

    __slots__ = ("alloc_index", "ident", "nbytes", "watch")

    def __init__(self, alloc_index: int, ident: int, nbytes: int) -> None:
        self.alloc_index = alloc_index
        self.ident = ident
        self.nbytes = nbytes
        self.watch: Any = None


@dataclass
class CaptureState:
    """Where the job is: phase, innermost module, optimizer steps taken."""

    phase: str = Phase.OTHER.value
    steps: int = 0
    forward_calls: int = 0
    epoch_steps: int | None = None  # batches per epoch of the DataLoader that fed training
    stopped: bool = False
    """The job was stopped before its end (the step limit, with its training loop not ended)."""
    backward_passes: int = 0
    manual_steps: int = 0
    """Training steps without an optimizer: parameters updated in place after a backward."""
    loop_ended: bool = False
    """The training loop was ended early (its DataLoader stopped) so what follows it ran."""
    grads_discarded: int = 0
    """`zero_grad` calls that cleared a backward's gradients before any step used them
    (capture.discarded_grads): backward passes made for something other than training."""


@dataclass
class CaptureSession:
    gpu: GpuProfile
    stack: StackProfile
    trace: Trace = field(default_factory=Trace)
    state: CaptureState = field(default_factory=CaptureState)
    live: dict[int, LiveStorage] = field(default_factory=dict)  # id(storage) -> record
    allocated_bytes: int = 0
    max_allocated_bytes: int = 0
    module_source: Callable[[], str | None] = lambda: None
    autocast_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """Autocast's weight-cast cache: id(leaf) -> (leaf, cast copy)."""
    _persistent: set[Any] = field(default_factory=set)
    _once: dict[Any, Any] = field(default_factory=dict)
    """`read_once`'s values, by key."""
    _scratch_sizes: dict[int, int] = field(default_factory=dict)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    closed: bool = False
    notes: list[str] = field(default_factory=list)
    failure_hints: list[str] = field(default_factory=list)
    """What to add to the one-line error if the job fails (capture.python_subprocesses)."""
    libraries: dict[str, int] = field(default_factory=dict)
    """Device memory loaded outside the caching allocator on first use, by library family."""
    graph_captures: int = 0
    """CUDA graph captures under way (`capture_begin` ... `capture_end`, capture.fake_graphs):
    a host read of a device tensor then fails as CUDA fails it (capture.device_map)."""
    eager: bool = False
    """Eager mode: device tensors have real values (capture.eager)."""
    host_value: Callable[[Any], Any] | None = None
    """Eager mode: a device tensor's real values as a host tensor (fake mode: zeros)."""
    fake_limit: str | None = None
    """Fake mode: why the fake device could not run an op the job called (the first one)."""
    host_reads: int = 0
    """Fake mode: host reads of device values answered with placeholder zeros."""
    host_reads_before_forward: int = 0
    """Fake mode: those of them made before the first forward pass (while the model was built)."""
    data_dependent: dict[str, int] = field(default_factory=dict)
    """Fake mode: data-dependent ops met (sized as if every element were selected)."""
    phase_tracker: Any = None
    """The capture's PhaseTracker while the job runs (a CUDA graph replaying a captured optimizer
    step counts the step: capture.fake_graphs)."""
    watch_op: Callable[[Any, tuple, Any], None] | None = None
    """Called by the recorder with every aten op, its arguments and outputs (the phase tracker
    watches for in-place updates of parameters, capture.weight_copies for EMA copies)."""
    storage_kinds: dict[int, str] = field(default_factory=dict)
    """id(untyped storage) -> what a meta storage stands for, where it is not GPU memory:
    "host" (a host tensor kept fake until its values are needed) or "meta" (the job's own meta
    tensor). Absent: "device"."""
    memory: Any = None
    """The allocator simulation the job's memory readings come from (capture.fake_memory)."""
    default_device_set: bool = False
    """The job called `torch.set_default_device` (undone after the capture)."""
    default_device_cuda: bool = False
    """... and its default device is CUDA (the capture device stands in for it)."""
    blas_workspace_sizes: dict[str, int] = field(default_factory=dict)
    """Workspace sizes the job set (`torch.backends.cuda.cublas_workspace_size(n)`, "cublas";
    `cublaslt_workspace_size(n)`, "cublaslt"): handles first used afterwards take them
    (capture.blas_workspaces, cuda_rules/blas.py)."""
    host_deferral: Any = None
    """The capture's host-deferral mode (capture.host_deferred) while the job runs."""
    stream: int = DEVICE_STREAM
    """The job's current stream (capture.fake_streams): new blocks come from its pool."""
    _recorded: set[int] = field(default_factory=set)
    """Allocation ids used on a stream besides their own (`Tensor.record_stream`), still live."""
    _deferred: list[int] = field(default_factory=list)
    """Of them, the freed ones: their blocks go back at the next sync point."""
    # out-of-place results replayed as in place: autograd's gradient accumulation
    # (capture/grad_accumulation.py) and ATen's composite-compliant branches
    # (capture/in_place_branches.py)
    _pending_accumulation: tuple[int, int, int, str | None] | None = None
    _max_before_last_alloc: int = 0
    accumulations_in_place: int = 0
    branches_in_place: dict[str, int] = field(default_factory=dict)
    """Branch name (capture/in_place_branches.py) -> results replayed as in place."""
    devices: Any = None
    """`nn.DataParallel` over several GPUs (capture.data_parallel.DeviceStates): the other
    devices' traces and live storages; None on one GPU."""
    op_observer: Callable[[Any, tuple, dict, Any, str, Any], None] | None = None
    """Called by the recorder with every op, its arguments, outputs, outputs' kind and the meta
    cache's entry of the call or None (utilization.observer: the per-op cost of the training
    steps)."""

    def storage_kind(self, tensor: torch.Tensor) -> str:
        """What a meta tensor stands for: "device" (GPU memory, the default), "host" or "meta"."""
        tensor = unwrap_functorch(tensor)
        if tensor.layout != torch.strided:
            parts = sparse_parts(tensor)
            return self.storage_kind(parts[-1]) if parts else "device"
        return self.storage_kinds.get(id(tensor.untyped_storage()), "device")

    # -- RuleContext ---------------------------------------------------------------------------
    @property
    def in_backward(self) -> bool:
        return self.state.phase == _BACKWARD

    def persistent(self, key: Any, nbytes: int, *, category: str, op: str) -> bool:
        if self.closed or not self.first_time(key):
            return False
        self._alloc(nbytes, category, op)
        return True

    def first_time(self, key: Any) -> bool:
        if key in self._persistent:
            return False
        self._persistent.add(key)
        return True

    def read_once(self, key: Any, read: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._once:
                self._once[key] = read()
            return self._once[key]

    def load_library(self, family: str) -> None:
        if family in self.libraries or self.closed:
            return
        self.libraries[family] = int(self.stack.library_bytes_for(self.gpu, family).value)

    def transient(
        self, nbytes: int, *, category: str, op: str, or_smaller: bool = False
    ) -> None:
        if self.closed:
            return
        ident = self._alloc(nbytes, category, op, or_smaller=or_smaller)
        self._free(ident, nbytes)

    def scratch(self, nbytes: int, *, category: str, op: str) -> int:
        if self.closed:
            return -1
        ident = self._alloc(nbytes, category, op)
        self._scratch_sizes[ident] = nbytes
        return ident

    def release(self, ident: int) -> None:
        nbytes = self._scratch_sizes.pop(ident, None)
        if nbytes is not None and not self.closed:
            self._free(ident, nbytes)

    # -- storages ------------------------------------------------------------------------------
    def default_category(self, op: str) -> str:
        """What a new block is tagged unless its op says: `other` between steps, `activation`
        in an evaluation's forward (Phase.EVAL), else `temporary` (a training forward's
        blocks still alive when backward starts become `activation` then)."""
        phase = self.state.phase
        if phase == _OTHER_PHASE:
            return _OTHER
        return _ACTIVATION if phase == _EVAL_PHASE else _TEMPORARY

    def track(self, tensor: torch.Tensor, op: str, category: str | None = None) -> None:
        """Record the allocation of `tensor`'s storage if it is new (a sparse tensor's: its
        indices' and values' storages)."""
        if tensor.layout != torch.strided:
            for part in sparse_parts(tensor):
                self.track(part, op, category)
            return
        storage = tensor.untyped_storage()
        check_storage_size(tensor, storage.nbytes())  # CUDA's overflow error, not 0 bytes
        self.track_storage(storage, op, category)

    def track_storage(self, storage: Any, op: str, category: str | None = None) -> None:
        """Record the allocation of an untyped device storage if it is new and not empty."""
        key = id(storage)
        with self._lock:
            if self.closed:
                return
            old = self.live.get(key)
            if old is None:  # the common call (every op's new output): `_alloc`'s body inline
                nbytes = storage.nbytes()
                if nbytes <= 0:
                    memory = self.memory
                    if memory is not None and memory.settle_config is not None:
                        memory.settle()  # an empty CUDA tensor initialises CUDA all the same
                    return
                self._pending_accumulation = None
                self._max_before_last_alloc = self.max_allocated_bytes
                memory = self.memory
                if memory is not None and memory.settle_config is not None:
                    memory.settle()  # as in `_alloc`: the job's first CUDA allocation
                trace = self.trace
                if category is None:  # `default_category`
                    phase = self.state.phase
                    category = (_OTHER if phase == _OTHER_PHASE
                                else _ACTIVATION if phase == _EVAL_PHASE else _TEMPORARY)
                ident = trace.alloc_tagged(nbytes, self.stream, trace.intern_fields(
                    category, self.module_source(), self.state.phase, op))
                if memory is not None and (memory.strict or self._oom_retry_near(memory, nbytes)):
                    memory.sync(raise_oom=True)  # raises the job's OutOfMemoryError
                allocated = self.allocated_bytes = self.allocated_bytes + nbytes
                if allocated > self.max_allocated_bytes:
                    self.max_allocated_bytes = allocated
                record = self.live[key] = LiveStorage(len(trace) - 1, ident, nbytes)
                record.watch = weakref.ref(storage, lambda _ref, key=key: self._storage_died(key))
                return
            if old is not None:
                if storage.nbytes() <= old.nbytes:
                    return
                # grown in place (`Tensor.resize_`, an `out=` op): CUDA's resize_bytes takes a
                # new block, copies, then frees the old one; a storage never shrinks that way
                del self.live[key]
                category = category or self._category_at(old.alloc_index)
            nbytes = storage.nbytes()
            if nbytes <= 0:
                return
            ident = self._alloc(nbytes, category or self.default_category(op), op)
            record = self.live[key] = LiveStorage(len(self.trace) - 1, ident, nbytes)
            if old is not None:
                self._free(old.ident, old.nbytes)
        # the record holds the weak reference whose callback frees the allocation (cheaper than
        # weakref.finalize; the record lives until the callback runs)
        record.watch = weakref.ref(storage, lambda _ref, key=key: self._storage_died(key))

    def _category_at(self, alloc_index: int) -> str | None:
        tag = self.trace.tag_of(alloc_index)
        return None if tag is None else tag.category

    def is_tracked(self, tensor: torch.Tensor) -> bool:
        tensor = unwrap_functorch(tensor)
        if tensor.layout != torch.strided:
            return all(self.is_tracked(part) for part in sparse_parts(tensor))
        return id(tensor.untyped_storage()) in self.live

    def untrack_storage(self, storage: Any) -> LiveStorage | None:
        """The storage's memory is given back while the storage lives on (`resize_(0)`): free
        its allocation now; returns its record (None if it was not tracked)."""
        with self._lock:
            record = self.live.pop(id(storage), None)
            if record is not None and not self.closed:
                self._free(record.ident, record.nbytes)
            return record

    def expect_accumulation(self, old: torch.Tensor, out: torch.Tensor) -> None:
        """`out = old + var` was autograd's gradient accumulation (capture/grad_accumulation.py):
        if `old`'s storage is released before anything else happens, the GPU run added in
        place (the buffer held the only reference), and the allocation of `out` is withdrawn."""
        self.expect_in_place(old, out)

    def expect_in_place(self, old: torch.Tensor, out: torch.Tensor,
                        branch: str | None = None) -> None:
        """`out` was made out of place from `old` where CUDA writes into `old` (gradient
        accumulation when `branch` is None, else an ATen branch of
        capture/in_place_branches.py): if `old`'s storage is released before anything else
        happens (the code dropped `old` for its result), the allocation of `out` is withdrawn
        and `old`'s lives on as `out`'s."""
        with self._lock:
            self._pending_accumulation = None
            if self.closed or old.untyped_storage().nbytes() < out.untyped_storage().nbytes():
                return
            old_key, out_key = id(old.untyped_storage()), id(out.untyped_storage())
            record = self.live.get(out_key)
            if record is None or old_key not in self.live or record.alloc_index != len(self.trace) - 1:
                return
            self._pending_accumulation = (old_key, out_key, self._max_before_last_alloc, branch)

    def _accumulated_in_place(self, key: int) -> bool:
        """The storage `key` dies right after the op that read it: replay the op as in place
        (see `expect_in_place`)."""
        pending, self._pending_accumulation = self._pending_accumulation, None
        if pending is None or pending[0] != key:
            return False
        _old_key, out_key, max_before, branch = pending
        old, out = self.live.get(key), self.live.get(out_key)
        if old is None or out is None or not self.trace.retract_last_alloc(out.ident):
            return False
        del self.live[key]
        self.allocated_bytes -= out.nbytes
        self.max_allocated_bytes = max_before
        out.alloc_index, out.ident, out.nbytes = old.alloc_index, old.ident, old.nbytes
        if branch is None:
            self.accumulations_in_place += 1
        else:
            self.branches_in_place[branch] = self.branches_in_place.get(branch, 0) + 1
        return True

    def _storage_died(self, key: int) -> None:
        with self._lock:
            if self._pending_accumulation is not None and self._accumulated_in_place(key):
                return
            record = self.live.pop(key, None)
            if record is None and self.devices is not None and self.devices.died_elsewhere(key):
                return  # another device's storage: freed there
            if record is not None and not self.closed:
                # `_free`'s body inline (the lock is held; no accumulation is pending now)
                ident = record.ident
                self.trace.free(ident)
                self.allocated_bytes -= record.nbytes
                if ident in self._recorded:
                    self._recorded.discard(ident)
                    self._deferred.append(ident)

    def _alloc(self, nbytes: int, category: str, op: str, *, or_smaller: bool = False) -> int:
        with self._lock:
            self._pending_accumulation = None
            self._max_before_last_alloc = self.max_allocated_bytes
            if self.memory is not None and self.memory.settle_config is not None:
                self.memory.settle()  # the first CUDA allocation: torch reads its allocator
                # configuration now (capture.job_alloc_conf); a bad one the job set raises here
            trace = self.trace
            ident = trace.alloc(
                nbytes,
                self.stream,
                tag_id=trace.intern_fields(category, self.module_source(), self.state.phase, op),
                or_smaller=or_smaller,
            )
            memory = self.memory
            if memory is not None and (memory.strict or self._oom_retry_near(memory, nbytes)):
                memory.sync(raise_oom=True)  # raises the job's OutOfMemoryError
            self.allocated_bytes += nbytes
            self.max_allocated_bytes = max(self.max_allocated_bytes, self.allocated_bytes)
            return ident

    def _oom_retry_near(self, memory: Any, nbytes: int) -> bool:
        """A retry loop that catches CUDA's out-of-memory error is running and this allocation
        comes near the GPU's capacity (capture.oom_retry, capture.oom_handlers)."""
        return near_capacity(self.allocated_bytes, nbytes, memory.total_bytes) and (
            retry_loop_on_stack() or oom_handler_on_stack())

    def _free(self, ident: int, nbytes: int) -> None:
        with self._lock:
            self._pending_accumulation = None
            self.trace.free(ident)
            self.allocated_bytes -= nbytes
            if ident in self._recorded:
                self._recorded.discard(ident)
                self._deferred.append(ident)

    # -- streams -------------------------------------------------------------------------------
    def record_stream(self, tensor: torch.Tensor, stream: int) -> None:
        """`tensor.record_stream(s)`: its block is used on stream `s` too; once freed, it is held
        until the next sync point (`synchronize_streams`)."""
        tensor = unwrap_functorch(tensor)
        if tensor.layout != torch.strided:
            for part in sparse_parts(tensor):
                self.record_stream(part, stream)
            return
        with self._lock:
            record = self.live.get(id(tensor.untyped_storage()))
            if record is None or self.closed:
                return
            if self.trace.streams[record.alloc_index] == stream:
                return  # its own stream: nothing to wait for (CUDACachingAllocator too)
            self.trace.record_stream(record.ident, stream)
            self._recorded.add(record.ident)

    def synchronize_streams(self) -> None:
        """A sync point (device or stream synchronize, an event wait, the end of an optimizer
        step): the other-stream uses of every freed block have completed."""
        with self._lock:
            if self.closed:
                return
            for ident in self._deferred:
                self.trace.free_completed(ident)
            self._deferred.clear()

    # -- classification ------------------------------------------------------------------------
    def classify(
        self,
        tensor: torch.Tensor | None,
        category: str,
        *,
        module: str | None = None,
        only_from: tuple[str, ...] | None = None,
    ) -> None:
        """Re-tag the allocation of `tensor`'s storage as `category` (and `module` if given).
        With `only_from`, only allocations currently tagged with one of those categories move."""
        if tensor is None:
            return
        tensor = unwrap_functorch(tensor)
        if not is_meta(tensor):
            return
        if is_wrapper(tensor):  # a tensor subclass: its inner storages
            for inner in inner_tensors(tensor):
                if inner is not tensor:
                    self.classify(inner, category, module=module, only_from=only_from)
            return
        if tensor.layout != torch.strided:
            for part in sparse_parts(tensor):
                self.classify(part, category, module=module, only_from=only_from)
            return
        with torch._C.DisableTorchFunction():  # runs in the job's hooks: no tensor subclass hook
            record = self.live.get(id(tensor.untyped_storage()))
        if record is None:
            return
        old = self.trace.tag_of(record.alloc_index) or _NO_TAG
        if only_from is not None and old.category not in only_from:
            return
        new = (category, module if module is not None else old.module, old.phase, old.op)
        if new != (old.category, old.module, old.phase, old.op):  # Tag equality, field by field
            self.trace.tag_ids[record.alloc_index] = self.trace.intern_fields(*new)

    def classify_storage(self, storage: Any, category: str, *,
                         only_from: tuple[str, ...] | frozenset[str]) -> None:
        """Re-tag the allocation of an untyped device storage as `category`, if it is tagged
        one of `only_from` (capture.model_copies: a copy whose tensor the job re-wrapped)."""
        record = self.live.get(id(storage))
        if record is None:
            return
        old = self.trace.tag_of(record.alloc_index) or _NO_TAG
        if old.category in only_from and old.category != category:
            self.trace.tag_ids[record.alloc_index] = self.trace.intern_fields(
                category, old.module, old.phase, old.op)

    def reclassify_live(self, category: str, *, phase: str, only_from: tuple[str, ...]) -> None:
        """Re-tag every live allocation made in `phase` whose category is in `only_from` (on
        every device: DataParallel over several GPUs)."""
        trace = self.trace
        for record in list(self.live.values()):
            old = trace.tag_of(record.alloc_index)
            if old is not None and old.phase == phase and old.category in only_from:
                trace.tag_ids[record.alloc_index] = trace.intern_fields(
                    category, old.module, old.phase, old.op
                )
        devices = self.devices
        if devices is not None and devices.current == 0:
            for index in devices.used:
                with devices.on(index):
                    self.reclassify_live(category, phase=phase, only_from=only_from)

    def reclassify_made_since(self, start: int, category: str, *, only_from: tuple[str, ...],
                              skip_phases: tuple[str, ...] = ()) -> None:
        """Re-tag every allocation made at or after trace event `start` (live or already freed)
        whose category is in `only_from` and whose phase is not in `skip_phases`
        (capture.collective_buffers: what a call allocated)."""
        trace = self.trace
        kinds, tag_ids = trace.kinds, trace.tag_ids
        for index in range(start, len(trace)):
            if kinds[index] not in ALLOC_KINDS:
                continue
            old = trace.tag_of(index)
            if old is not None and old.category in only_from and old.phase not in skip_phases:
                tag_ids[index] = trace.intern_fields(category, old.module, old.phase, old.op)

    def mark(self, label: str) -> None:
        if not self.closed:
            self.trace.mark(label)

    def empty_cache(self) -> None:
        if not self.closed:
            self.trace.empty_cache()

    def close(self) -> None:
        """Stop recording: frees from tearing the job down are not part of the run."""
        self.closed = True


def unwrap_functorch(tensor: Any) -> Any:
    """The tensor under torch.func's wrappers (`grad`'s TensorWrapper, `vmap`'s BatchedTensor),
    which have no storage of their own: module and optimizer hooks see them inside a transform
    (`vmap(grad(functional_call(model, ...)))`); any other object comes back as it is."""
    functorch = torch._C._functorch
    while isinstance(tensor, torch.Tensor) and functorch.is_functorch_wrapped_tensor(tensor):
        tensor = functorch.get_unwrapped(tensor)
    return tensor
