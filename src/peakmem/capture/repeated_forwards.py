"""Repeated no-grad forwards (issue 14): an evaluation loop of identical forwards
(nanoGPT's `estimate_loss`: `eval_iters` calls of `model(X, Y)` under `torch.no_grad()`) is
run op by op only until it provably repeats; later calls replay the events of the last one.

A candidate call is a top-level `Module.__call__` (no module call around it) with gradients
off (or inference mode), in fake mode, whose arguments are plain device tensors (meta, not
host-deferred), numbers, strings, None and tuples / lists / dicts of them. Its key: the module,
every input tensor's shape / stride (but of size-1 dimensions) / dtype / flags / storage
offset's 16-byte alignment (not the offset itself), the other argument values,
grad / inference / autocast modes, backend flags, the capture's stream, the phase tracker's
state, and a fingerprint of the module tree (each module's `__dict__` entries by identity,
`training`, its parameters and buffers with their shapes and dtypes).

A call is observed (run for real, its trace window kept) and becomes a template when, during it:
- the trace got only allocations and frees, every free of an allocation made in the call
  (no marks, other streams, graph pools, frees of older tensors);
- no op wrote into a tensor made before the call (BatchNorm running stats, KV caches, buffers,
  inputs), read a device value on the host (`.item()` inside the forward), drew random numbers
  (dropout in train mode) or had a data-dependent output shape;
- the module tree's fingerprint, the phase tracker's state, the capture's counters (forward
  calls, host reads, notes, libraries, data-dependent ops, in-place replays) did not move;
- what the call left alive is exactly its output's storages, each one made in the call (no
  output aliasing an input or a parameter; nothing kept elsewhere), and the output is a tensor,
  None, a number or a string, or a tuple / list / dict / namedtuple / dataclass (HF
  ModelOutput) of them, no output carrying Python attributes (known host values:
  capture.device_map).
After REQUIRED_WINDOWS consecutive templates of one key with the same events (ids shifted), its
outputs' layouts and the same per-op costs (utilization), the next calls of the key replay the
last template: its events with fresh ids, the per-op cost record extended as the ops would, and
fresh fake device tensors of the outputs' layouts tracked as the replayed allocations (so their
frees come when the job drops them). Refused (run for real) while a memory cap is set, a side
stream is current, Dynamo's frame callback is set, the module or any global hook besides the
capture's own is registered, or the utilization observer is not the capture's.

Exact by construction (the trace, peaks and per-op costs are those of the real calls), so on by
default; PEAKMEM_REPEAT_FORWARDS=0 turns it off.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.modules.module as module_hooks
from torch._C._dynamo.eval_frame import get_eval_frame_callback
from torch.compiler import is_compiling

from peakmem.capture import length_family
from peakmem.capture.session import DEVICE_STREAM, CaptureSession, LiveStorage
from peakmem.cuda_rules import reductions
from peakmem.trace.events import EventKind

REQUIRED_WINDOWS = 3
"""Consecutive isomorphic calls of one key before the next ones are replayed."""
MAX_KEYS = 8
"""Keys whose observed calls are kept (the most recent ones): a decode loop's calls, each of
another shape, keep no more."""
ENV_FLAG = "PEAKMEM_REPEAT_FORWARDS"
_ALLOC = int(EventKind.ALLOC)
_ALLOC_SMALLER = int(EventKind.ALLOC_OR_SMALLER)
_FREE = int(EventKind.FREE)
_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
_SCALARS = (type(None), bool, int, float, str, complex, torch.dtype, torch.device)
_GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks")
_REFUSED = object()


def enabled_by_env() -> bool:
    return os.environ.get(ENV_FLAG, "1").strip().lower() not in ("0", "false", "no", "off")


class _Refused(Exception):
    """The call cannot be a template (or replayed): it runs for real."""


@dataclasses.dataclass
class _Window:
    """One observed call: its events (relative ids), outputs, per-op cost record slice."""

    kinds: list[int]
    ids: list[int]  # allocations: offset from the window's first id; frees: the same
    sizes: list[int]
    streams: list[int]
    tags: list[int]
    outputs: Any  # the output's structure, tensors as _Out
    storages: tuple[tuple[int, int], ...]  # (event offset of the allocation, nbytes) per slot
    costs: tuple | None  # the utilization record's slice (see _observer_slice)
    n_ids: int
    checks: tuple = ()  # the reductions' scratch configurations asked (cuda_rules.reductions)

    def same(self, other: _Window) -> bool:
        return (self.kinds == other.kinds and self.ids == other.ids and self.sizes == other.sizes
                and self.streams == other.streams and self.tags == other.tags
                and self.outputs == other.outputs and self.storages == other.storages
                and self.costs == other.costs and self.n_ids == other.n_ids
                and self.checks == other.checks)


@dataclasses.dataclass(frozen=True)
class _Out:
    slot: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    inference: bool


class RepeatedForwards:
    """Patches `Module.__call__` while a capture runs (see the module docstring)."""

    def __init__(self, session: CaptureSession, tracker: Any = None) -> None:
        self.session = session
        self.tracker = tracker
        self.replayed = 0
        self.replayed_lengths = 0
        """Of `replayed`, the calls predicted from a growing-length family (length_family)."""
        self.in_doubt = 0
        """Of `replayed_lengths`, the calls before a check that found the fit wrong."""
        self._families: dict[Any, tuple[length_family.Family, weakref.ref]] = {}
        self._local = threading.local()
        self._history: dict[Any, tuple[_Window, int]] = {}
        """Per key: its last template and how many templates in a row were the same."""
        self._modules: dict[Any, weakref.ref] = {}
        self._own_hooks: dict[str, frozenset] = {}
        self._write_args: dict[int, tuple] = {}
        self._watch: dict | None = None

    @contextmanager
    def installed(self) -> Iterator[RepeatedForwards]:
        self._own_hooks = {name: frozenset(getattr(module_hooks, name)) for name in _GLOBAL_HOOKS}
        original = torch.nn.Module.__call__
        repeater = self
        local = self._local
        main = threading.main_thread()

        def __call__(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
            # Dynamo tracing a call (it inlines `__call__`) sees the original call only; so
            # does any thread but the main one
            if is_compiling() or threading.current_thread() is not main:
                return original(module, *args, **kwargs)
            if getattr(local, "depth", 0):
                local.depth += 1
                try:
                    return original(module, *args, **kwargs)
                finally:
                    local.depth -= 1
            return repeater._top_call(original, module, args, kwargs)

        torch.nn.Module.__call__ = __call__
        try:
            yield self
        finally:
            torch.nn.Module.__call__ = original

    def note(self) -> str | None:
        if not self.replayed:
            return None
        lengths = ""
        if self.replayed_lengths:
            lengths = (f"; {self.replayed_lengths} of them predicted at a new sequence length "
                       f"from {length_family.OBSERVED} calls of growing length, checked")
        if self.in_doubt:
            lengths += (f" ({self.in_doubt} of those before a check that found the fit wrong: "
                        f"they may differ from running them)")
        return (f"{self.replayed} no-grad forward call(s) replayed from an identical earlier "
                f"call (its events repeated after {REQUIRED_WINDOWS} identical calls{lengths}; "
                f"{ENV_FLAG}=0 runs them all)")

    # -- the call ------------------------------------------------------------------------------
    def _top_call(self, original: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        key = self._key(module, args, kwargs)
        if key is None:
            return self._run(original, module, args, kwargs)
        history = self._history.get(key)
        if history is not None and self._modules[key]() is not module:
            history = None  # another module at a reused id
            del self._history[key]
        if history is not None and history[1] >= REQUIRED_WINDOWS:
            out = self._replay(history[0])
            if out is not _REFUSED:
                self.replayed += 1
                return out
        family_key, inputs = _family_key(key)
        family = self._family(family_key, module)
        if family is not None and family.fit is not None and not family.due_for_check():
            out = self._replay_family(family, inputs)
            if out is not _REFUSED:
                self.replayed += 1
                self.replayed_lengths += 1
                family.unchecked += 1
                return out
        window = None
        start = self._start()
        outer_checks, reductions.SCRATCH_CALLS = reductions.SCRATCH_CALLS, []
        try:
            out = self._run(original, module, args, kwargs)
        finally:
            checks, reductions.SCRATCH_CALLS = reductions.SCRATCH_CALLS, outer_checks
            watch, self._watch = self._watch, None
            if watch is not None and self.session.op_observer == self._watching:
                self.session.op_observer = watch["chained"]
        if start is not None:
            try:
                window = self._finish(start, watch, out, key, module, tuple(checks or ()))
            except Exception:  # noqa: BLE001 - anything unexpected: the call is no template
                window = None
        if window is None:
            self._history.pop(key, None)
            self._modules.pop(key, None)
            self._families.pop(family_key, None)
            return out
        self._observe_family(family_key, family, module, inputs, window)
        last = self._history.pop(key, None)
        same = last is not None and last[0].same(window)
        self._history[key] = (window, last[1] + 1 if same else 1)  # the most recent key last
        self._modules[key] = weakref.ref(module)
        while len(self._history) > MAX_KEYS:
            oldest = next(iter(self._history))
            del self._history[oldest], self._modules[oldest]
        return out

    # -- growing-length families (length_family) -----------------------------------------------
    def _family(self, family_key: Any, module: torch.nn.Module) -> length_family.Family | None:
        entry = self._families.get(family_key)
        if entry is None:
            return None
        if entry[1]() is not module:
            del self._families[family_key]  # another module at a reused id
            return None
        return entry[0]

    def _observe_family(self, family_key: Any, family: length_family.Family | None,
                        module: torch.nn.Module, inputs: list, window: _Window) -> None:
        numbers: list = []
        skeleton = length_family.flatten(window, numbers)
        if family is None or family.skeleton != skeleton:
            if family is not None and family.fit is not None:
                self.in_doubt += family.unchecked  # a check that found other events
            family = length_family.Family(skeleton, family_key)
        self._families.pop(family_key, None)
        self._families[family_key] = (family, weakref.ref(module))  # the most recent last
        while len(self._families) > length_family.MAX_FAMILIES:
            del self._families[next(iter(self._families))]
        self.in_doubt += family.observe(inputs, numbers)

    def _replay_family(self, family: length_family.Family, inputs: list) -> Any:
        numbers = family.predict(inputs)
        if numbers is None:
            return _REFUSED
        window = length_family.rebuild(family.skeleton, iter(numbers))
        if min(window.sizes, default=0) < 0 or any(n < 0 for _, n in window.storages):
            return _REFUSED
        for call, answer in window.checks:  # thresholds: asked again at the predicted layouts
            if reductions.scratch_bytes(*call) != answer:
                return _REFUSED
        return self._replay(window)

    def _run(self, original: Any, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        local = self._local
        local.depth = 1
        try:
            return original(module, *args, **kwargs)
        finally:
            local.depth = 0

    # -- the key -------------------------------------------------------------------------------
    def _key(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        session = self.session
        if (session.closed or session.eager or torch.is_grad_enabled()
                or session.stream != DEVICE_STREAM or get_eval_frame_callback() is not None
                or session._recorded or session._deferred):
            return None
        memory = session.memory
        if memory is not None and getattr(memory, "strict", False):
            return None
        if type(module).__name__ == "OptimizedModule":
            return None
        for name in _GLOBAL_HOOKS:
            if frozenset(getattr(module_hooks, name)) != self._own_hooks.get(name):
                return None
        observer = _observer(session)
        if observer is _REFUSED:
            return None
        try:
            inputs = _signature(session, (args, kwargs))
            tree = _fingerprint(module)
        except _Refused:
            return None
        return (id(module), inputs, tree, _modes(), self._tracker_state(),
                len(session.autocast_cache))

    def _tracker_state(self) -> tuple:
        state = self.session.state
        tracker = self.tracker
        extra: tuple = ()
        if tracker is not None:
            extra = (getattr(tracker, "_in_eval", None), getattr(tracker, "_stop_pending", None))
        return (state.phase, state.steps, state.stopped, state.loop_ended, *extra)

    def _tracker_quiet(self) -> bool:
        """The phase tracker's forward hook would change nothing (see phases._forward_pre)."""
        tracker = self.tracker
        if tracker is None:
            return True
        if getattr(tracker, "_stop_pending", False):
            return False
        if getattr(tracker, "_in_eval", False):
            loaders = getattr(tracker, "loaders", None)
            return loaders is None or not loaders.inside_training_batch()
        return self.session.state.phase != "other"

    # -- observing -----------------------------------------------------------------------------
    def _counters(self) -> tuple:
        session, state = self.session, self.session.state
        return (state.forward_calls, state.backward_passes, state.manual_steps, state.steps,
                session.host_reads, session.accumulations_in_place, len(session.notes),
                len(session.libraries), len(session.failure_hints),
                sum(session.data_dependent.values()), sum(session.branches_in_place.values()),
                len(session._persistent), len(session.autocast_cache), session.fake_limit)

    def _start(self) -> dict | None:
        session = self.session
        if not self._tracker_quiet():
            return None
        trace = session.trace
        observer = _observer(session)
        start = {
            "index": len(trace), "first_id": trace._next_id, "counters": self._counters(),
            "tracker": self._tracker_state(), "observer": _observer_start(session, observer),
            "lengths": None if observer is None else _observer_lengths(observer),
        }
        self._watch = {"first_id": trace._next_id, "refused": False,
                       "chained": session.op_observer}
        session.op_observer = self._watching
        return start

    def _watching(self, func: Any, args: tuple, kwargs: dict, out: Any, kind: str,
                  cached: Any = None) -> None:
        watch = self._watch
        chained = watch["chained"] if watch is not None else None
        if watch is not None and not watch["refused"] and self._side_effect(func, args, kwargs,
                                                                            watch["first_id"]):
            watch["refused"] = True
        if chained is not None:
            chained(func, args, kwargs, out, kind, cached)

    def _side_effect(self, func: Any, args: tuple, kwargs: dict, first_id: int) -> bool:
        if func is _LOCAL_SCALAR:
            return True
        tags = getattr(func, "tags", ())
        if torch.Tag.nondeterministic_seeded in tags or torch.Tag.dynamic_output_shape in tags:
            return True
        written = self._write_args.get(id(func))
        if written is None:
            schema = getattr(func, "_schema", None)
            if schema is None:
                return True  # a higher-order operator: not looked into
            written = tuple(
                (i, arg.name) for i, arg in enumerate(schema.arguments)
                if arg.alias_info is not None and arg.alias_info.is_write
            )
            self._write_args[id(func)] = written
        live = self.session.live
        for index, name in written:
            value = args[index] if index < len(args) else kwargs.get(name)
            for tensor in _tensors(value):
                with torch._C.DisableTorchFunction():
                    record = live.get(id(tensor.untyped_storage()))
                if record is None or record.ident < first_id:
                    return True  # a tensor made before the call (or not device memory)
        return False

    def _finish(self, start: dict, watch: dict | None, out: Any, key: Any,
                module: torch.nn.Module, checks: tuple = ()) -> _Window | None:
        session = self.session
        if watch is None or watch["refused"]:
            return None
        if self._counters() != start["counters"] or self._tracker_state() != start["tracker"]:
            return None
        try:
            if _fingerprint(module) != key[2]:
                return None  # an attribute of the module tree set during the call
        except _Refused:
            return None
        trace = session.trace
        first, first_id, end_id = start["index"], start["first_id"], trace._next_id
        kinds = trace.kinds[first:]
        ids = []
        for kind, ident in zip(kinds, trace.ids[first:], strict=True):
            if kind not in (_ALLOC, _ALLOC_SMALLER, _FREE) or ident < first_id:
                return None
            ids.append(ident - first_id)
        # what the call left alive: exactly its outputs' storages
        alive = {record.ident: record for record in session.live.values()
                 if record.ident >= first_id}
        if any(ident >= first_id for ident in session._scratch_sizes):
            return None
        slots: dict[int, int] = {}
        storages: list[tuple[int, int]] = []

        def leaf(tensor: torch.Tensor) -> _Out:
            if type(tensor) is not torch.Tensor or tensor.layout != torch.strided:
                raise _Refused
            with torch._C.DisableTorchFunction():
                if not tensor.is_meta or tensor.requires_grad or tensor.is_conj() or (
                        tensor.is_neg()):
                    raise _Refused
                storage = tensor.untyped_storage()
                record = session.live.get(id(storage))
                if record is None or record.ident < first_id or (
                        storage.nbytes() != record.nbytes):
                    raise _Refused
                if id(storage) in session.storage_kinds:
                    raise _Refused
                base = tensor._base
                if tensor.__dict__ or (base is not None and base.__dict__):
                    raise _Refused  # what the capture keeps on a tensor (known host values)
                slot = slots.get(id(storage))
                if slot is None:
                    slot = slots[id(storage)] = len(storages)
                    storages.append((record.alloc_index - first, record.nbytes))
                    alive.pop(record.ident, None)
                return _Out(slot, tensor.storage_offset(), tuple(tensor.shape),
                            tuple(tensor.stride()), tensor.dtype, tensor.is_inference())

        outputs = _structure(out, leaf)
        if alive:
            return None  # something else kept a tensor the call made
        costs = _observer_slice(session, start["observer"], start["lengths"])
        if costs is _REFUSED:
            return None
        return _Window(kinds, ids, trace.sizes[first:], trace.streams[first:],
                       trace.tag_ids[first:], outputs, tuple(storages), costs,
                       end_id - first_id, checks)

    # -- replaying -----------------------------------------------------------------------------
    def _replay(self, window: _Window) -> Any:
        session = self.session
        if not self._tracker_quiet():
            return _REFUSED
        observer = _observer(session)
        if window.costs is not None and (
                _observer_start(session, observer) != window.costs[0]
                or len(observer.current.ops) + len(window.costs[1]) >= _max_ops()):
            return _REFUSED
        if window.costs is None and observer is not None:
            return _REFUSED
        memory = session.memory
        if memory is not None:
            from peakmem.capture.oom_retry import near_capacity

            top = max(window.sizes, default=0) + sum(s for _, s in window.storages)
            if near_capacity(session.allocated_bytes, top, memory.total_bytes):
                return _REFUSED
        trace = session.trace
        first, first_id = len(trace), trace._next_id
        with session._lock:
            trace.kinds.extend(window.kinds)
            trace.ids.extend([first_id + i for i in window.ids])
            trace.sizes.extend(window.sizes)
            trace.streams.extend(window.streams)
            trace.tag_ids.extend(window.tags)
            trace._next_id = first_id + window.n_ids
            allocated, peak = session.allocated_bytes, session.max_allocated_bytes
            sizes: dict[int, int] = {}
            before_last = peak
            for kind, ident, size in zip(window.kinds, window.ids, window.sizes, strict=True):
                if kind == _FREE:
                    allocated -= sizes[ident]
                else:
                    before_last = peak
                    sizes[ident] = size
                    allocated += size
                    peak = max(peak, allocated)
            session.allocated_bytes, session.max_allocated_bytes = allocated, peak
            session._max_before_last_alloc = before_last
            session._pending_accumulation = None
            tensors = []
            with torch._C._DisableTorchDispatch(), torch._C.DisableTorchFunction():
                storages = []
                for offset, nbytes in window.storages:
                    storage = torch.empty(nbytes, dtype=torch.uint8,
                                          device="meta").untyped_storage()
                    storages.append(storage)
                    key = id(storage)
                    record = session.live[key] = LiveStorage(
                        first + offset, first_id + window.ids[offset], nbytes)
                    record.watch = weakref.ref(
                        storage, lambda _ref, key=key: session._storage_died(key))

                def make(spec: _Out) -> torch.Tensor:
                    with torch.inference_mode(spec.inference):
                        tensor = torch.empty((0,), dtype=spec.dtype, device="meta")
                        tensor.set_(storages[spec.slot], spec.offset, spec.size, spec.stride)
                    tensors.append(tensor)
                    return tensor

                out = _rebuild(window.outputs, make)
        if window.costs is not None:
            _observer_apply(session, observer, window.costs)
        return out


# -- helpers -----------------------------------------------------------------------------------
def _max_ops() -> int:
    from peakmem.utilization.observer import MAX_OPS_PER_STEP

    return MAX_OPS_PER_STEP


def _observer(session: CaptureSession) -> Any:
    """The capture's utilization observer (None: none set; _REFUSED: an unknown one)."""
    hook = session.op_observer
    if hook is None:
        return None
    owner = getattr(hook, "__self__", None)
    from peakmem.utilization.observer import OpCostObserver

    if isinstance(owner, OpCostObserver) and hook.__func__ is OpCostObserver.observe:
        return owner
    if isinstance(owner, RepeatedForwards):
        return _REFUSED
    return _REFUSED


def _observer_start(session: CaptureSession, observer: Any) -> tuple | None:
    """What the utilization record's next entries depend on (None: no observer)."""
    if observer is None:
        return None
    record = observer.current
    return (observer._step == session.state.steps, observer.failed,
            session.host_reads - observer._reads, record.trailing_syncs, record.overflow)


def _observer_lengths(observer: Any) -> tuple:
    record = observer.current
    return (id(record), len(record.ops), len(record.phases), len(record.syncs_before),
            record.host_ops, record.host_bytes, record.host_random_bytes, record.input_bytes)


def _observer_slice(session: CaptureSession, start: tuple | None, lengths: tuple | None) -> Any:
    """The utilization record's part made by the call: (its start state, the ops, phases and
    syncs appended, the trailing syncs at the end, the host counters' growth, whether the
    observer saw an op) or _REFUSED (the record rolled to another step, overflowed, ...)."""
    observer = _observer(session)
    if start is None or lengths is None:
        return None if observer is None else _REFUSED
    if observer is None or observer is _REFUSED or not start[0] or start[1] is not None:
        return _REFUSED
    record = observer.current
    if id(record) != lengths[0] or record.overflow or observer.failed is not None:
        return _REFUSED
    now = _observer_lengths(observer)
    _, n_ops, n_phases, n_syncs = lengths[:4]
    return (start, tuple(record.ops[n_ops:]), tuple(record.phases[n_phases:]),
            tuple(record.syncs_before[n_syncs:]), record.trailing_syncs,
            tuple(b - a for a, b in zip(lengths[4:], now[4:], strict=True)),
            observer._reads == session.host_reads)


def _observer_apply(session: CaptureSession, observer: Any, costs: tuple) -> None:
    _start, ops, phases, syncs, trailing, host, saw_ops = costs
    record = observer.current
    record.ops.extend(ops)
    record.phases.extend(phases)
    record.syncs_before.extend(syncs)
    record.trailing_syncs = trailing
    record.host_ops += host[0]
    record.host_bytes += host[1]
    record.host_random_bytes += host[2]
    record.input_bytes += host[3]
    if saw_ops:
        observer._reads = session.host_reads


def _family_key(key: tuple) -> tuple[Any, list]:
    """The key with the input signature's integers abstracted (a tensor's sizes and strides,
    an int argument; not the storage offset's alignment), and those integers."""
    inputs: list = []
    skeleton = length_family.flatten(_aligned(key[1]), inputs)
    return (key[0], skeleton, *key[2:]), inputs


def _aligned(signature: Any) -> Any:
    """The signature with each tensor's offset alignment kept out of the abstracted numbers."""
    if type(signature) is tuple and signature:
        if signature[0] == "T" and len(signature) == 9 and type(signature[1]) is tuple:
            return (*signature[:3], ("alignment", str(signature[3])), *signature[4:])
        return tuple(_aligned(item) for item in signature)
    return signature


def _modes() -> tuple:
    cuda = torch.backends.cuda
    cudnn = torch.backends.cudnn
    return (
        torch.is_inference_mode_enabled(),
        torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
        torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
        torch.is_autocast_cache_enabled(),
        torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
        cudnn.enabled, cudnn.benchmark, cudnn.deterministic, _precision_flags(),
        cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(), cuda.math_sdp_enabled(),
    )


def _precision_flags() -> tuple:
    """The float32 precision settings, read without raising: once the job (or its libraries:
    the Trainer's bf16 + torch.compile path) has set them through both of torch's APIs with
    values that disagree (`set_float32_matmul_precision("high")`, then
    `matmul.fp32_precision = "ieee"`), reading the legacy flags raises "a mix of the legacy
    and new APIs"; the new API's per-backend values stand for them then."""
    cuda = torch.backends.cuda
    try:
        return (torch.backends.cudnn.allow_tf32, cuda.matmul.allow_tf32,
                torch.get_float32_matmul_precision())
    except RuntimeError:
        from peakmem.capture.process_state import precision_objects

        return tuple(getattr(obj, "fp32_precision", None) for obj in precision_objects())


def _signature(session: CaptureSession, value: Any) -> Any:
    """The call's arguments as a hashable key (tensors by layout); _Refused for anything else."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor or value.layout != torch.strided:
            raise _Refused
        with torch._C.DisableTorchFunction():
            if not value.is_meta:
                raise _Refused
            storage = value.untyped_storage()
            if id(storage) in session.storage_kinds or id(storage) not in session.live:
                raise _Refused  # host-deferred, the job's own meta tensor, untracked
            # not in the key: the stride of a size-1 dimension and the storage offset, which
            # change nothing a fake-mode call allocates (a sliding window `idx[:, -block:]` of
            # a growing sequence changes both every call), but the offset's 16-byte alignment
            # (CUDA reductions vectorize by it: cuda_rules/reductions.py's staging buffers);
            # the templates' own events and output layouts must still match before any call
            # is replayed
            shape = tuple(value.shape)
            strides = tuple(None if size == 1 else stride
                            for size, stride in zip(shape, value.stride(), strict=True))
            alignment = value.storage_offset() * value.element_size() % 16
            return ("T", shape, strides, alignment, value.dtype, value.requires_grad,
                    value.is_inference(), value.is_conj(), value.is_neg())
    if type(value) in _SCALARS:
        return (type(value), value)
    if type(value) in (tuple, list):
        return (type(value), tuple(_signature(session, item) for item in value))
    if type(value) is dict:
        return (dict, tuple((k, _signature(session, v)) for k, v in value.items()
                            if type(k) is str) + (len(value),))
    raise _Refused


def _fingerprint(module: torch.nn.Module) -> tuple:
    """The module tree's state by identity (see the module docstring)."""
    parts: list = []
    add = parts.append
    with torch._C.DisableTorchFunction():  # shapes read without the capture's modes
        for sub in module.modules():
            if (sub._forward_hooks or sub._forward_pre_hooks or sub._backward_hooks
                    or sub._backward_pre_hooks):
                raise _Refused
            state = sub.__dict__
            add(id(sub))
            add(tuple(state))
            add(tuple(map(id, state.values())))
            add(sub.training)
            for table in (sub._parameters, sub._buffers):
                if table:
                    add(tuple(table))
                    for tensor in table.values():
                        add(None if tensor is None else (id(tensor), tensor.shape, tensor.dtype))
    return tuple(parts)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _structure(value: Any, leaf: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("T", leaf(value))
    if type(value) in _SCALARS:
        return ("S", value)
    if type(value) in (tuple, list):
        return (type(value), tuple(_structure(item, leaf) for item in value))
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):  # a namedtuple
        return ("N", type(value), tuple(_structure(item, leaf) for item in value))
    if type(value) is dict:
        return (dict, tuple((k, _structure(v, leaf)) for k, v in value.items()))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        if not all(f.init for f in fields):
            raise _Refused
        names = tuple(f.name for f in fields)
        if isinstance(value, dict) and set(value.keys()) - set(names):
            raise _Refused  # a ModelOutput with keys set after construction
        return ("D", type(value), tuple((name, _structure(getattr(value, name), leaf))
                                        for name in names))
    raise _Refused


def _rebuild(spec: Any, make: Any) -> Any:
    head = spec[0]
    if head == "T":
        return make(spec[1])
    if head == "S":
        return spec[1]
    if head in (tuple, list):
        return head(_rebuild(item, make) for item in spec[1])
    if head == "N":
        return spec[1]._make(_rebuild(item, make) for item in spec[2])
    if head is dict:
        return {k: _rebuild(v, make) for k, v in spec[1]}
    if head == "D":
        return spec[1](**{name: _rebuild(item, make) for name, item in spec[2]})
    raise AssertionError(spec)
