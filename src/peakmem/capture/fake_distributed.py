"""Distributed training in the capture's one process: a fake process group of the full world size.

The traced rank runs with the environment a launcher gives it (RANK, WORLD_SIZE, LOCAL_RANK, ...:
``peakmem.jobs.launchers``). Every process group it creates (``init_process_group`` with nccl,
gloo, ``env://``, ``tcp://``, a store; ``new_group``; ``init_device_mesh``) is a
:class:`FakeGroup` of the requested size: its collectives are shape-correct no-ops that complete
at once, nothing leaves the process (no store, no network). What the wrappers allocate around the
collectives (DDP's gradient buckets, FSDP's all-gather and reduce-scatter buffers, ZeRO's
partitions) is allocated by the wrappers themselves, on the fake device, and recorded as usual.

What NCCL itself allocates through the caching allocator is allocated here too: the flattened
buffer of a list all-gather / reduce-scatter (``ProcessGroupNCCL``'s ``newLikeFlat``). NCCL's own
memory outside the allocator (communicators, channel buffers) is not a tensor: it is in the GPU
profiles (``nccl_overhead_bytes``), see docs/capture.md "Distributed".

Host (CPU) tensors get values as if every rank held the same ones (an all-gather repeats the
input, a sum all-reduce multiplies by the world size): ``all_gather_object`` and
``broadcast_object_list`` work, and metrics averaged over ranks keep their value.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from peakmem.capture.collective_buffers import communicating, made_during, tag_communication
from peakmem.capture.session import CaptureSession
from peakmem.cuda_rules.true_device import is_meta

BACKEND = "peakmem_fake"
"""The name the fake group is registered under (the job sees the backend it asked for)."""

DEFAULT_BACKEND = "nccl"
NCCL_FAMILY = "nccl"
"""The library family of NCCL's own device memory in the stack profiles (`library_bytes`)."""


# -- the rank's environment ---------------------------------------------------------------------


@dataclass(frozen=True)
class RankEnv:
    """What a launcher told this process about its place in the world."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @classmethod
    def from_environ(cls, environ: Any = None) -> RankEnv:
        env = os.environ if environ is None else environ

        def number(name: str, default: int) -> int:
            try:
                value = int(str(env.get(name, default)).strip())
            except ValueError:
                return default
            return value if value >= 0 else default

        world = max(1, number("WORLD_SIZE", 1))
        rank = min(number("RANK", 0), world - 1)
        local_world = max(1, number("LOCAL_WORLD_SIZE", 1))
        local_rank = min(number("LOCAL_RANK", 0), local_world - 1)
        return cls(rank, world, local_rank, local_world)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or "WORLD_SIZE" in os.environ


# -- the fake group -----------------------------------------------------------------------------


def _done(result: Any) -> Any:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


def _host(tensor: Any) -> bool:
    """A real host tensor (its values are the job's); device tensors are meta (no values)."""
    return isinstance(tensor, torch.Tensor) and not is_meta(tensor)


def _gathered_host_data(output: Any, inputs: list[Any]) -> None:
    """A device all-gather of device tensors whose values are known on the host (built from host
    data: accelerate's `gather(torch.tensor(t.shape, device=...))` sizing its padding): the
    output holds them, every rank's being this rank's, as host tensors' values do here."""
    from peakmem.capture.device_map import give_host_data, known_host_data

    if not is_meta(output) or not inputs:
        return
    known = [known_host_data(tensor) if is_meta(tensor) else None for tensor in inputs]
    if any(host is None for host in known):
        return
    give_host_data(output, torch.cat([host.reshape(-1) for host in known]))


def _reduce_op(opts: Any) -> Any:
    return getattr(opts, "reduceOp", None)


def _scale_sum(tensor: torch.Tensor, size: int, opts: Any) -> None:
    """A SUM over `size` ranks holding the same value."""
    op = _reduce_op(opts)
    if op is not None and op == dist.ReduceOp.SUM and size > 1 and tensor.dtype != torch.bool:
        tensor.mul_(size)


def _flat_scratch(tensors: Sequence[torch.Tensor], count: int) -> None:
    """ProcessGroupNCCL's `newLikeFlat`: a list all-gather / reduce-scatter runs on one
    flattened buffer of `count` tensors like the first, freed when the collective ends."""
    if not tensors or not is_meta(tensors[0]):
        return
    first = tensors[0]
    scratch = first.new_empty((count, *first.shape))
    tag_communication(scratch, running_session())
    del scratch


WITHOUT_NCCL = frozenset({"gloo", "mpi"})
"""Backends whose collectives on device tensors make no NCCL communicator (gloo stages device
tensors through host memory): no NCCL memory outside the allocator."""


def _count_communicators(change: int) -> None:
    """A group's NCCL communicator was made (+1) or destroyed (-1): NCCL's memory outside the
    allocator is that of the most communicators live at once (GPU profile figure each)."""
    _STATE.live_communicators += change
    if _STATE.live_communicators <= _STATE.communicators:
        return
    _STATE.communicators = _STATE.live_communicators
    session = _STATE.session
    if session is not None and not session.closed:
        each = int(session.stack.library_bytes_for(session.gpu, NCCL_FAMILY).value)
        session.libraries[NCCL_FAMILY] = each * _STATE.communicators


NATIVE_BACKEND_NAMES = frozenset({"gloo"})
"""Backends c10d's C++ looks up by type when a group reports their name: DDP's logger casts a
"gloo" group's backend to ProcessGroupGloo for its thread count ("Could not find backend type 1
for Process Group with name gloo": every DDP over gloo failed). The fake group reports its own
name to C++ for these."""


class FakeGroup(dist.ProcessGroup):
    """A process group of `size` ranks seen from rank `rank`: every collective completes at once
    and sends nothing."""

    def __init__(self, rank: int, size: int, backend_name: str = DEFAULT_BACKEND) -> None:
        super().__init__(rank, size)
        self._rank, self._size, self._backend_name = rank, size, backend_name
        self._communicator = False

    def _on_device(self, *values: Any) -> None:
        """A collective on device tensors: the first one creates this group's NCCL communicator,
        whose buffers live outside the caching allocator (GPU profile figure, per communicator
        of more than one rank) until the group is destroyed; a gloo group makes none."""
        if self._communicator or self._size < 2 or self._backend_name in WITHOUT_NCCL:
            return
        from torch.utils._pytree import tree_leaves

        if any(is_meta(value) for value in tree_leaves(list(values))):
            self._communicator = True
            _count_communicators(+1)

    def shutdown(self) -> None:
        """`destroy_process_group`: the group's NCCL communicator (if it made one) is freed."""
        if self._communicator:
            self._communicator = False
            _count_communicators(-1)
        super().shutdown()

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def getBackendName(self) -> str:  # noqa: N802 - c10d's name
        if self._backend_name in NATIVE_BACKEND_NAMES:
            return BACKEND  # `dist.get_backend` still answers the job's name
        return self._backend_name

    @property
    def group_name(self) -> str:
        """The name c10d registered this group under (a Python group answers it itself)."""
        from torch.distributed import distributed_c10d as c10d

        return c10d._world.pg_names.get(self, "")

    @property
    def pg_name(self) -> str:
        return self.group_name

    def __repr__(self) -> str:
        return f"FakeGroup(rank={self._rank}, size={self._size}, backend={self._backend_name})"

    # all-reduce / broadcast / reduce: in place
    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        self._on_device(tensors)
        tensors = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        with torch.no_grad():
            for tensor in tensors:
                if _host(tensor):
                    _scale_sum(tensor, self._size, opts)
        return _done(tensors)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        self._on_device(tensors)
        return _done(list(tensors) if isinstance(tensors, (list, tuple)) else [tensors])

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        self._on_device(tensors)
        return _done(list(tensors))

    # all-gather
    def allgather(self, output_lists: Any, inputs: Any, opts: Any = None) -> Any:
        self._on_device(output_lists, inputs)
        with torch.no_grad():
            for outputs, tensor in zip(output_lists, inputs, strict=False):
                _flat_scratch([tensor], len(outputs))
                if _host(tensor):
                    for out in outputs:
                        if _host(out) and out.numel() == tensor.numel():
                            out.copy_(tensor.reshape(out.shape))
                else:
                    for out in outputs:
                        _gathered_host_data(out, [tensor])
        return _done(output_lists)

    def allgather_coalesced(self, output_lists: Any, inputs: Any, opts: Any = None) -> Any:
        return self.allgather(output_lists, inputs, opts)

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Any:
        self._on_device(output, tensor)
        if _host(output) and _host(tensor) and output.numel() == tensor.numel() * self._size:
            with torch.no_grad():
                output.view(self._size, -1).copy_(tensor.reshape(1, -1).clone())  # in place: a view
        elif output.numel() == tensor.numel() * self._size:
            _gathered_host_data(output, [tensor] * self._size)
        return _done([output])

    all_gather_single = _allgather_base

    def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        self._on_device(outputs, inputs)
        for output, tensor in zip(outputs, inputs, strict=False):
            self._allgather_base(output, tensor, opts)
        return _done(list(outputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    # reduce-scatter
    def reduce_scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> Any:
        self._on_device(outputs, input_lists)
        with torch.no_grad():
            for out, inputs in zip(outputs, input_lists, strict=False):
                _flat_scratch(list(inputs), len(inputs))
                mine = inputs[self._rank] if self._rank < len(inputs) else None
                if _host(out) and _host(mine) and out.numel() == mine.numel():
                    out.copy_(mine.reshape(out.shape))
                    _scale_sum(out, self._size, opts)
        return _done(list(outputs))

    def _reduce_scatter_base(self, output: torch.Tensor, tensor: torch.Tensor,
                             opts: Any = None) -> Any:
        self._on_device(output, tensor)
        if _host(output) and _host(tensor) and tensor.numel() == output.numel() * self._size:
            with torch.no_grad():
                output.copy_(tensor.reshape(self._size, -1)[self._rank].reshape(output.shape).clone())
                _scale_sum(output, self._size, opts)
        return _done([output])

    reduce_scatter_single = _reduce_scatter_base

    def reduce_scatter_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        self._on_device(outputs, inputs)
        for output, tensor in zip(outputs, inputs, strict=False):
            self._reduce_scatter_base(output, tensor, opts)
        return _done(list(outputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # all-to-all
    def alltoall_base(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Any,
                      input_splits: Any, opts: Any = None) -> Any:
        self._on_device(output, tensor)
        if _host(output) and _host(tensor) and output.shape == tensor.shape:
            with torch.no_grad():
                output.copy_(tensor)
        return _done([output])

    def all_to_all_single(self, output: torch.Tensor, tensor: torch.Tensor, output_splits: Any,
                          input_splits: Any, opts: Any = None) -> Any:
        return self.alltoall_base(output, tensor, output_splits, input_splits, opts)

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        self._on_device(outputs, inputs)
        with torch.no_grad():
            for out, tensor in zip(outputs, inputs, strict=False):
                if _host(out) and _host(tensor) and out.shape == tensor.shape:
                    out.copy_(tensor)
        return _done(list(outputs))

    # gather / scatter
    def gather(self, output_lists: Any, inputs: Any, opts: Any = None) -> Any:
        self._on_device(output_lists, inputs)
        with torch.no_grad():
            for outputs, tensor in zip(output_lists, inputs, strict=False):
                for out in outputs:
                    if _host(out) and _host(tensor) and out.shape == tensor.shape:
                        out.copy_(tensor)
        return _done(output_lists)

    def scatter(self, outputs: Any, input_lists: Any, opts: Any = None) -> Any:
        self._on_device(outputs, input_lists)
        with torch.no_grad():
            for out, inputs in zip(outputs, input_lists, strict=False):
                mine = inputs[self._rank] if self._rank < len(inputs) else None
                if _host(out) and _host(mine) and out.shape == mine.shape:
                    out.copy_(mine)
        return _done(list(outputs))

    # point to point and barriers: nothing arrives (receive buffers keep their values)
    def send(self, tensors: Any, dst: int, tag: int = 0) -> Any:
        self._on_device(tensors)
        return _done(list(tensors))

    def recv(self, tensors: Any, src: int, tag: int = 0) -> Any:
        self._on_device(tensors)
        return _done(list(tensors))

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        self._on_device(tensors)
        return _done(list(tensors))

    def barrier(self, opts: Any = None) -> Any:
        return _done([])

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        return None


PEER_OBJECT_USERS = {
    "torch.distributed.pipelining": ("pipeline parallelism across ranks",
                                     "torch.distributed.pipelining's stages send each other their "
                                     "inputs' and gradients' shapes"),
}
"""Libraries known to receive objects from a peer rank, by module prefix: what the one-line
message names (what the job needed, how it used the object), instead of the unpickling error
the job would raise far from its cause."""


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None,
                     use_batch: bool = False) -> Any:
    """`dist.recv_object_list` under the fake group: an object another rank sends cannot be
    made up (its size, then its pickled bytes, would arrive from nowhere: the job unpickled the
    receive buffer's zeros). The capture stops with one line naming what needed it."""
    import sys

    from peakmem.capture.unsupported import Unsupported

    peer = src if src is not None else group_src
    caller = sys._getframe(1).f_globals.get("__name__", "")
    what, how = next((named for prefix, named in PEER_OBJECT_USERS.items()
                      if caller == prefix or caller.startswith(prefix + ".")),
                     ("receiving a Python object from another rank", "the job receives one"))
    raise Unsupported(f"{what} ({how} with dist.recv_object_list, from rank {peer} here; "
                      "under the fake process group no other rank runs to send it)")


def _create(common: Any, options: Any = None) -> FakeGroup:
    """c10d's extended creator: `common` holds the group's rank and size."""
    return FakeGroup(common.group_rank, common.group_size, _STATE.backend_name)


def register_backend() -> None:
    """Register the fake group with c10d once per process."""
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                      devices=["cpu", "cuda", "meta"])


class _State:
    backend_name: str = DEFAULT_BACKEND
    session: CaptureSession | None = None
    communicators: int = 0
    """The most NCCL communicators live at once in this capture."""
    live_communicators: int = 0
    patched: dict[tuple[Any, str], Any] = {}


_STATE = _State()


def running_session() -> CaptureSession | None:
    """The capture the fake process groups belong to (None outside one)."""
    session = _STATE.session
    return None if session is None or session.closed else session


def _backend_name(backend: Any) -> str:
    """The backend the job asked for, as `dist.get_backend` reports it ("nccl" for device
    groups; "cpu:gloo,cuda:nccl" -> "nccl")."""
    if backend is None:
        return DEFAULT_BACKEND
    text = str(backend).lower()
    if "," in text or ":" in text:
        parts = dict(part.split(":", 1) for part in text.split(",") if ":" in part)
        return parts.get("cuda", DEFAULT_BACKEND)
    return text if text not in ("undefined", BACKEND) else DEFAULT_BACKEND


def _init_method_fields(init_method: Any) -> dict[str, int]:
    """rank / world_size written into a `tcp://host:port?rank=..&world_size=..` URL."""
    if not isinstance(init_method, str) or "?" not in init_method:
        return {}
    from urllib.parse import parse_qs, urlparse

    found = {}
    for key, values in parse_qs(urlparse(init_method).query).items():
        if key in ("rank", "world_size") and values and values[0].isdigit():
            found[key] = int(values[0])
    return found


# -- libraries' cross-rank checks ---------------------------------------------------------------

# Checks that ranks agree, made by broadcasting a device tensor and reading it back on the host:
# a device tensor holds no value here, and every rank is this one, so they agree. Module ->
# function -> replacement; applied once the library is imported (at init_process_group).
AGREEMENT_CHECKS: dict[str, dict[str, Any]] = {
    "deepspeed.runtime.zero.utils": {
        "assert_lst_len_same_as_other_ranks": lambda lst: None,
        "get_lst_from_rank0": lambda lst: list(lst),
    },
}


def _agreement_checks_patched() -> None:
    import sys

    for module_name, functions in AGREEMENT_CHECKS.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, replacement in functions.items():
            if hasattr(module, name) and (module, name) not in _STATE.patched:
                _STATE.patched[(module, name)] = getattr(module, name)
                setattr(module, name, replacement)


def _agreement_checks_restored() -> None:
    for (module, name), original in _STATE.patched.items():
        setattr(module, name, original)
    _STATE.patched.clear()


# -- DDP's reducer --------------------------------------------------------------------------------


class _HostRoundTrip(TorchDispatchMode):
    """While DDP's reducer syncs its rebuilt bucket order (c10d's `sync_bucket_indices`: host
    indices copied to a device tensor, broadcast from rank 0, copied back to the host), the copy
    back reads the values that were copied in (a device tensor here is meta and holds none): what
    rank 0's broadcast would deliver to it. Every other op passes on unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self._sent: dict[int, tuple[Any, torch.Tensor]] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # the job's device view and the capture's torch-function modes are not for this op
        with torch._C.DisableTorchFunction():
            if func is torch.ops.aten.copy_.default and len(args) >= 2:
                dst, src = args[0], args[1]
                if is_meta(dst) and not is_meta(src):
                    self._sent[id(dst)] = (weakref.ref(dst), src.detach().clone())
                elif not is_meta(dst) and is_meta(src) and id(src) in self._sent:
                    ref, values = self._sent[id(src)]
                    if ref() is src and values.shape == dst.shape:
                        return dst.copy_(values)
            return func(*args, **kwargs)


def _reducer_class() -> Any:
    base = dist.Reducer

    class Reducer(base):  # type: ignore[misc, valid-type]
        """c10d's Reducer, whose bucket rebuild reads back the bucket order it broadcast. The
        buckets it makes (built with it, rebuilt at the first iteration) are `communication`
        (capture.collective_buffers; `gradient` once the gradients are views of them, with
        `gradient_as_bucket_view=True`)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with made_during(session=running_session()):
                super().__init__(*args, **kwargs)

        def _rebuild_buckets(self) -> bool:
            with _HostRoundTrip(), made_during(session=running_session()):
                return super()._rebuild_buckets()

    Reducer.__module__, Reducer.__qualname__ = base.__module__, base.__qualname__
    return Reducer


# -- patches ------------------------------------------------------------------------------------


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    """(object, attribute) -> replacement for torch.distributed during a capture."""
    if not dist.is_available():
        return {}
    from torch.distributed import distributed_c10d as c10d

    register_backend()
    _STATE.session, _STATE.communicators, _STATE.live_communicators = session, 0, 0
    env = RankEnv.from_environ()
    original_init = c10d.init_process_group
    original_helper = c10d._new_process_group_helper
    original_get_backend = c10d.get_backend
    current = {"device": env.local_rank}

    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                           world_size: int = -1, rank: int = -1, store: Any = None,
                           group_name: str = "", pg_options: Any = None, device_id: Any = None,
                           **kwargs: Any) -> None:
        fields = _init_method_fields(init_method)
        live = RankEnv.from_environ()
        world_size = world_size if isinstance(world_size, int) and world_size > 0 else \
            fields.get("world_size", live.world_size)
        rank = rank if isinstance(rank, int) and rank >= 0 else fields.get("rank", live.rank)
        _STATE.backend_name = _backend_name(backend)
        note = (f"torch.distributed: a fake {_STATE.backend_name} process group of world size "
                f"{world_size} (this is rank {rank}); collectives send nothing")
        if note not in session.notes:
            session.notes.append(note)
        kwargs.pop("_ranks", None)
        _agreement_checks_patched()
        return original_init(backend=BACKEND, timeout=timeout, world_size=world_size, rank=rank,
                             store=dist.HashStore(), group_name=group_name, **kwargs)

    def new_process_group_helper(group_size: int, group_rank: int, global_ranks_in_group: Any,
                                 backend: Any, store: Any, group_name: Any,
                                 backend_options: Any = None, timeout: Any = None,
                                 pg_tag: Any = None, device_id: Any = None,
                                 group_desc: Any = None) -> Any:
        return original_helper(group_size, group_rank, global_ranks_in_group,
                               dist.Backend(BACKEND), store, group_name, None, timeout, pg_tag,
                               None, group_desc)

    def get_backend(group: Any = None) -> Any:
        name = original_get_backend(group)
        return dist.Backend(_STATE.backend_name) if str(name) == BACKEND else name

    def verify_params(process_group: Any, tensors: Any, logger: Any = None) -> None:
        """DDP's check that every rank holds parameters of the same shapes: c10d broadcasts a
        tensor of their sizes and strides (int64) from the first parameter's device and reads
        it back; here it is allocated and freed (`communication`), and nothing is compared."""
        tensors = list(tensors)
        if tensors:
            count = 2 * sum(t.dim() for t in tensors)
            scratch = tensors[0].new_empty((count,), dtype=torch.int64)
            tag_communication(scratch, session)
            del scratch

    def device_count() -> int:
        return max(1, env.local_world_size)

    def current_device() -> int:
        return current["device"]

    def set_device(device: Any) -> None:
        from peakmem.capture.device_ordinals import check_ordinal

        index = getattr(device, "index", device)
        if isinstance(device, str):
            index = torch.device(device).index
        if isinstance(index, int) and index >= 0:
            check_ordinal(index)  # beyond the node's GPUs: CUDA's invalid device ordinal
            current["device"] = index

    def set_device_index(device: Any) -> None:
        set_device(device)

    found: dict[tuple[Any, str], Any] = {
        (c10d, "init_process_group"): init_process_group,
        (dist, "init_process_group"): init_process_group,
        (c10d, "_new_process_group_helper"): new_process_group_helper,
        (c10d, "get_backend"): get_backend,
        (dist, "get_backend"): get_backend,
        (dist, "_verify_params_across_processes"): verify_params,
        (dist, "Reducer"): _reducer_class(),
        # DDP's parameter and buffer sync from rank 0 flattens them into broadcast buffers
        (dist, "_broadcast_coalesced"): communicating(dist._broadcast_coalesced),
        (c10d, "is_nccl_available"): lambda: True,
        # FSDP2's default mesh and DTensor ask the compiled-in accelerator (none on a CPU
        # build): the fake runtime's GPU
        (torch._C, "_get_accelerator"): lambda check=False: torch.device("cuda"),
        (dist, "is_nccl_available"): lambda: True,
        (c10d, "recv_object_list"): recv_object_list,
        (dist, "recv_object_list"): recv_object_list,
    }
    from torch.distributed import device_mesh

    if hasattr(device_mesh, "init_process_group"):
        # `init_device_mesh` with no default group calls the name it imported: without this,
        # the real rendezvous waits for the other ranks forever
        found[(device_mesh, "init_process_group")] = init_process_group
    if env.local_rank > 0:
        # the rank's tensors are on its own GPU (`torch.cuda.set_device(local_rank)`): the job's
        # view of device tensors says cuda:LOCAL_RANK
        from peakmem.capture import device_view

        mine = torch.device("cuda", env.local_rank)
        found[(device_view, "JOB_DEVICE")] = mine
        found[(device_view, "_BY_KIND")] = {**device_view._BY_KIND, "device": mine}
    if env.local_world_size > 1:
        found.update({
            (torch.cuda, "device_count"): device_count,
            (torch.accelerator, "device_count"): device_count,
            (torch.cuda, "current_device"): current_device,
            (torch.accelerator, "current_device_index"): current_device,
            (torch.cuda, "set_device"): set_device,
            (torch.accelerator, "set_device_index"): set_device_index,
        })
    return found


@contextlib.contextmanager
def process_groups_destroyed() -> Iterator[None]:
    """Process groups the job left behind are destroyed when the capture ends: the next capture
    in the same process starts from none ("initialize the default process group twice")."""
    try:
        yield
    finally:
        if dist.is_available() and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        _STATE.backend_name, _STATE.session = DEFAULT_BACKEND, None
        _STATE.communicators = _STATE.live_communicators = 0
        _agreement_checks_restored()
