"""During a capture: the cost of every device op of the training steps, kept for the last
completed step (the steady state), and written into the trace's metadata at the end.

The recorder calls `OpCostObserver.observe` once per aten op (session.op_observer). The
observer also counts the host-side work of each step (ops on real CPU tensors: the
DataLoader's indexing, collation and random data) and the host reads of device values
(`.item()`: a device synchronisation each).

A call the meta cache keeps (capture.meta_cache: every tensor argument and output a plain meta
tensor, the key their layouts and every other argument) whose tensors are all device ones gets
the same decision and cost every time: the first works them out, the entry's `memo` keeps them,
and later calls of the key (this capture's and later captures' in the process) read them back
after checking that none of their storages is a lazily stacked batch (host data).
"""

from __future__ import annotations

from typing import Any

import torch

from peakmem.capture.session import CaptureSession
from peakmem.utilization.kernel_families import META_KEY
from peakmem.utilization.op_costs import (
    ATTENTION,
    CONV,
    GEMM,
    family_of,
    launches_kernel,
    meta_op_cost,
    op_cost_key,
)

_RANDOM_OPS = frozenset({"normal", "normal_", "randn", "rand", "uniform_", "randint", "random_",
                         "bernoulli", "bernoulli_", "randperm"})
FORMAT_VERSION = 1
MAX_OPS_PER_STEP = 200_000
MAX_REMEMBERED_COSTS = 100_000
REMEMBERED_FAMILIES = frozenset({GEMM, CONV, ATTENTION})
"""Kernel families whose cost (torch's FLOP formulas) takes longer than its key; the others
(a few byte counts) are costed afresh."""
REMEMBERED_COSTS: dict[tuple, Any] = {}
"""op_cost by op_cost_key (a pure function of the key), shared by the captures of a process: a
training step repeats the same calls every iteration, a bench worker's rows the same layers."""
_UNSEEN = object()
_NO_TENSORS = object()
"""A cached call's memo: the op has no tensor argument or output (nothing is costed)."""
_NO_VIEW = torch._C.DisableTorchFunction
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_COPY_OPS = frozenset({"_to_copy", "copy_"})
_SCALARS = frozenset({int, float, bool, type(None), str, torch.dtype, torch.device, torch.layout,
                      torch.memory_format})


class _OpFacts:
    """What the observer reads of an op overload on every call, looked up once."""

    __slots__ = ("name", "family", "kernel", "remembered", "random", "copy")

    def __init__(self, func: Any) -> None:
        self.name: str = func.overloadpacket.__name__
        self.family = family_of(self.name)
        self.kernel = launches_kernel(func)
        self.remembered = self.family in REMEMBERED_FAMILIES
        self.random = self.name in _RANDOM_OPS
        self.copy = self.name in _COPY_OPS


class StepRecord:
    def __init__(self) -> None:
        self.ops: list[list[Any]] = []
        self.phases: list[str] = []
        self.syncs_before: list[int] = []  # host reads (syncs) seen just before each op
        self.host_ops = 0
        self.host_bytes = 0
        self.host_random_bytes = 0  # host random data (randn per sample in a Dataset)
        self.input_bytes = 0  # host -> device copies
        self.trailing_syncs = 0
        self.overflow = False

    def to_json(self, step: int) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "step": step,
            "ops": self.ops,
            "phases": self.phases,
            "syncs_before": self.syncs_before,
            "host_ops": self.host_ops,
            "host_bytes": self.host_bytes,
            "host_random_bytes": self.host_random_bytes,
            "input_bytes": self.input_bytes,
            "trailing_syncs": self.trailing_syncs,
            "overflow": self.overflow,
        }


class OpCostObserver:
    """Per-op costs of the current and the last completed training step."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self.current = StepRecord()
        self.best: dict[str, Any] | None = None
        self.failed: str | None = None
        self._step = session.state.steps
        self._reads = session.host_reads
        self._costs = REMEMBERED_COSTS
        self._facts: dict[Any, _OpFacts] = {}

    def _roll(self) -> None:
        state = self.session.state
        if state.steps != self._step:
            # the first step (model build, optimizer state init) is kept only until a steady
            # one; of the steady steps, the one that moved the most input (a full batch, not an
            # epoch's smaller last one), the latest of equals
            record = self.current.to_json(state.steps)
            record["steady"] = self._step > 0
            if self.best is None or _rank(record) >= _rank(self.best):
                self.best = record
            self.current = StepRecord()
            self._step = state.steps

    def _sync_check(self) -> int:
        reads = self.session.host_reads
        delta, self._reads = reads - self._reads, reads
        return max(delta, 0)

    def observe(self, func: Any, args: tuple, kwargs: dict, out: Any, kind: str,
                cached: Any = None) -> None:
        """Record one op; an op the cost model cannot read (an unusual tensor subclass) turns
        the observer off rather than failing the job's capture. `cached`: where the meta cache
        keeps the call (capture.meta_cache.Cached: its entry, its tensor arguments' storage
        ids), None where it does not."""
        if self.failed:
            return
        try:
            if cached is not None and kind == "device":
                memo = cached[0].memo
                if memo is not None:
                    session = self.session
                    deferral = session.host_deferral
                    if (deferral is None or not deferral.collated
                            or self._all_on_device(cached[1], out)):
                        # `_observe`'s answer from the entry's memo, one frame less per op
                        if session.state.steps != self._step:
                            self._roll()
                        record = self.current
                        reads = session.host_reads
                        syncs, self._reads = max(reads - self._reads, 0), reads
                        if memo is _NO_TENSORS:
                            record.trailing_syncs += syncs
                        else:
                            self._append(record, memo[0], syncs)
                        return
            self._observe(func, args, kwargs, out, kind, cached)
        except Exception as exc:  # noqa: BLE001 - never let the utilization model break a capture
            self.failed = f"{type(exc).__name__} on {getattr(func, '__name__', func)}"

    def observe_host_op(self, name: str, made_bytes: int, *, random: bool = False) -> None:
        """A host op that ran lazily (the DataLoader's collate stack, a Dataset's random
        sample: capture.host_deferred): counted as the op on real host tensors it stands
        for (`random`: a random draw)."""
        if self.failed:
            return
        self._roll()
        record = self.current
        syncs = self._sync_check()
        record.host_ops += 1
        record.host_bytes += made_bytes
        if random:
            record.host_random_bytes += made_bytes
        record.trailing_syncs += syncs

    def _observe(self, func: Any, args: tuple, kwargs: dict, out: Any, kind: str,
                 cached: Any = None) -> None:
        if self.session.state.steps != self._step:
            self._roll()
        record = self.current
        reads = self.session.host_reads
        syncs, self._reads = max(reads - self._reads, 0), reads
        entry = None
        if cached is not None:
            entry, storages = cached
            memo = entry.memo
            if memo is not None and kind == "device" and self._all_on_device(storages, out):
                # a call of a key seen before, its tensors all on the device: as then
                if memo is _NO_TENSORS:
                    record.trailing_syncs += syncs
                else:
                    self._append(record, memo[0], syncs)
                return
        facts = self._facts.get(func)
        if facts is None:
            facts = self._facts[func] = _OpFacts(func)
        inputs = _tensors_of(args)
        if kwargs:
            inputs += _tensors_of(tuple(kwargs.values()))
        outputs = [out] if type(out) in _PLAIN_TENSORS else _tensors_of((out,))
        with _NO_VIEW():  # the recorder calls with torch functions off already: true devices
            meta_inputs = [t for t in inputs if t.is_meta]
            meta_outputs = [t for t in outputs if t.is_meta]
            deferral = self.session.host_deferral
            device: list | None = None
            if deferral is not None and deferral.collated:  # lazily stacked batches: host data
                collated = deferral.collated
                device = [t for t in meta_inputs + meta_outputs
                          if id(t.untyped_storage()) not in collated]
                on_device = len(device)
            else:
                on_device = len(meta_inputs) + len(meta_outputs)
            # a cached call whose every tensor is on the device: what follows is a function of
            # the meta cache's key alone (its layouts and values), kept in the entry's memo
            keep = (entry is not None and kind == "device"
                    and on_device == len(inputs) + len(outputs))
            if kind != "device" or not on_device:
                if keep:
                    entry.memo = _NO_TENSORS
                if (inputs or outputs) and not on_device:
                    made = sum(int(t.numel()) * t.element_size() for t in outputs
                               if t.layout == torch.strided)
                    record.host_ops += 1
                    record.host_bytes += made
                    if facts.random:
                        record.host_random_bytes += made
                record.trailing_syncs += syncs
                return
            if facts.copy and on_device < len(inputs) + len(outputs):
                copied = meta_inputs + meta_outputs if device is None else device
                record.input_bytes += sum(int(t.numel()) * t.element_size() for t in copied)
                record.trailing_syncs += syncs
                return  # a host -> device copy: the copy engine, not a kernel
            cost = self._cost(facts, func, args, kwargs, out, meta_inputs, meta_outputs)
        if keep:
            entry.memo = (cost,)
        self._append(record, cost, syncs)

    def _all_on_device(self, storages: dict[int, int], out: Any) -> bool:
        """Of a cached call (every tensor argument and output a plain meta tensor; `storages`:
        the arguments' storage ids), whether none is a lazily stacked batch (host data:
        capture.host_deferred), as the full path's filter finds."""
        deferral = self.session.host_deferral
        if deferral is None:
            return True
        collated = deferral.collated
        if not collated:
            return True
        if not collated.isdisjoint(storages):
            return False
        if type(out) in _PLAIN_TENSORS:
            return id(out.untyped_storage()) not in collated
        if type(out) in (tuple, list):
            return all(t is None or id(t.untyped_storage()) not in collated for t in out)
        return out is None

    def _append(self, record: StepRecord, cost: Any, syncs: int) -> None:
        """Add the cost of a device op (None: it launches no kernel) to the step's record."""
        if cost is None:
            record.trailing_syncs += syncs
            return
        if len(record.ops) >= MAX_OPS_PER_STEP:
            record.overflow = True
            return
        record.ops.append(cost.to_row())
        record.phases.append(self.session.state.phase)
        record.syncs_before.append(syncs + record.trailing_syncs)
        record.trailing_syncs = 0

    def _cost(self, facts: _OpFacts, func: Any, args: tuple, kwargs: dict, out: Any,
              inputs: list, outputs: list) -> Any:
        """`op_cost` (its device `inputs` / `outputs` given), remembered by `op_cost_key` for
        the families whose FLOP formulas cost more than the key."""
        if not facts.kernel:
            return None
        if not facts.remembered:
            return meta_op_cost(func, facts.name, facts.family, args, kwargs, out, inputs,
                                outputs)
        key = op_cost_key(func, args, kwargs, out)
        if key is None:
            return meta_op_cost(func, facts.name, facts.family, args, kwargs, out, inputs,
                                outputs)
        cost = self._costs.get(key, _UNSEEN)
        if cost is _UNSEEN:
            cost = meta_op_cost(func, facts.name, facts.family, args, kwargs, out, inputs,
                                outputs)
            if len(self._costs) < MAX_REMEMBERED_COSTS:
                self._costs[key] = cost
        return cost

    def finish(self) -> None:
        """Write the costs of a full steady step into the trace's metadata."""
        if self.failed:
            self.session.notes.append(
                f"utilization: per-op costs could not be recorded ({self.failed}): not predicted"
            )
            return
        self._roll()
        if self.best is not None:
            self.session.trace.meta[META_KEY] = self.best


def _rank(record: dict[str, Any]) -> tuple[bool, int, int]:
    return record["steady"], record["input_bytes"], len(record["ops"])


def _tensors_of(values: tuple) -> list[torch.Tensor]:
    """The tensors among `values` and inside their lists/tuples (two levels: foreach ops' tensor
    lists); faster than a pytree flatten on the capture's hot path (exact types first, then
    the isinstance checks for subclasses)."""
    found: list[torch.Tensor] = []
    for value in values:
        kind = type(value)
        if kind in _PLAIN_TENSORS:
            found.append(value)
        elif kind in _SCALARS:
            continue
        elif kind is list or kind is tuple or isinstance(value, (list, tuple)):
            for item in value:
                item_kind = type(item)
                if item_kind in _PLAIN_TENSORS:
                    found.append(item)
                elif item_kind in _SCALARS:
                    continue
                elif isinstance(item, torch.Tensor):
                    found.append(item)
                elif isinstance(item, (list, tuple)):
                    found.extend(t for t in item if isinstance(t, torch.Tensor))
        elif isinstance(value, torch.Tensor):
            found.append(value)
    return found
