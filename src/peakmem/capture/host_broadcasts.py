"""`broadcast_object_list` and `scatter_object_list` under the fake process group.

c10d sends Python objects as pickled bytes: the source rank pickles them, broadcasts the sizes
and then the bytes, and every other rank unpickles what arrived. Under the fake group nothing
arrives, so a rank other than the source would read an uninitialised size tensor (a huge or
negative allocation: Lightning's `strategy.broadcast(log_dir)` failed on rank 1 that way) and
unpickle garbage. Here no bytes are made or read (nothing is ever unpickled), and the values are
the ones the rest of the fake group gives host data, as if every rank held this rank's:
- `broadcast_object_list(objects, src)`: `objects` keeps what this rank passed. Every rank runs
  the same script, so a value each rank computes itself (Lightning broadcasts its log dir, a
  seed, a run name) is the source's; a list a non-source rank fills with placeholders
  (`[None]`) keeps them (the source's values are unknowable here).
- `scatter_object_list(out, inputs, src)`: `out[0] = inputs[rank]` where this rank passed the
  inputs (the source), else `out` is left as it is.
The device memory these calls take (a few bytes of sizes and pickles) is not traced.

`all_gather_object` / `gather_object` run c10d's own (each peer's entry a copy of this rank's
object); where the caller gathers what differs by rank by construction (a sharded model's
optimizer state keys), capture/peer_objects.py answers each peer's object instead.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from peakmem.capture import peer_objects
from peakmem.capture.session import CaptureSession


def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """Every rank ends with the objects it passed (as if the source held the same)."""
    return None


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: Any = None,
                        group_src: int | None = None) -> None:
    if scatter_object_input_list is None or not scatter_object_output_list:
        return None
    rank = dist.get_rank(group) if group is not None else dist.get_rank()
    if 0 <= rank < len(scatter_object_input_list):
        scatter_object_output_list[0] = scatter_object_input_list[rank]
    return None


def _rank(group: Any) -> int:
    return dist.get_rank(group) if group is not None else dist.get_rank()


def _object_gathers(original_all_gather: Any, original_gather: Any) -> dict[str, Any]:
    def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
        """c10d's, then the peers' entries the registry knows for the caller."""
        frame = peer_objects.caller_frame()
        original_all_gather(object_list, obj, group=group)
        peer_objects.fill_peers(object_list, frame, obj, _rank(group))

    def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                      group: Any = None, group_dst: int | None = None) -> None:
        frame = peer_objects.caller_frame()
        original_gather(obj, object_gather_list, dst, group=group, group_dst=group_dst)
        if object_gather_list:
            peer_objects.fill_peers(object_gather_list, frame, obj, _rank(group))

    return {"all_gather_object": all_gather_object, "gather_object": gather_object}


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    if not dist.is_available():
        return {}
    from torch.distributed import distributed_c10d as c10d

    found: dict[tuple[Any, str], Any] = {}
    gathers = _object_gathers(c10d.all_gather_object, c10d.gather_object)
    for owner in (dist, c10d):
        for name, replacement in gathers.items():
            found[(owner, name)] = replacement
        found[(owner, "broadcast_object_list")] = broadcast_object_list
        found[(owner, "scatter_object_list")] = scatter_object_list
    return found
