"""What the other ranks contribute to `all_gather_object` / `gather_object` under the fake group.

The capture runs one rank (the traced one) in one process: the peers never run, so their objects
do not exist. c10d's object collectives give every rank the list of all ranks' objects; by
default each peer's entry is a copy of this rank's object (every rank runs the same script: a
value each rank computes itself, a metric, a flag, is the same on all). That is wrong where a
library gathers what differs by rank *by construction*: the part of a sharded model each rank
holds. For those call sites a registry (the calling function -> a function computing a peer's
object from the caller's frame) answers what that peer would have sent:

- FSDP1 (`use_orig_params=True`) optimizer state dicts: `_map_param_key_to_optim_keys` gathers
  the keys of the parameters each rank holds optimizer state for (those whose span in a flat
  parameter meets the rank's shard), and `_allgather_state_info` the shape of each rank's local
  state; a checkpoint save (Lightning's ModelCheckpoint, `FSDP.optim_state_dict`) needs both.

A peer's object is worked out from the flat parameters' layout (the same on every rank), never
read from bytes: nothing is unpickled.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

PeerAnswer = Callable[[FrameType, Any, int], Any]
"""(the caller's frame, this rank's object, the peer's rank) -> the peer's object; raises
LookupError where it cannot tell (the peer's entry is then this rank's)."""


# -- FSDP1 flat parameters ----------------------------------------------------------------------


def _param_spans(flat_param: Any) -> list[tuple[int, int]]:
    """[start, end) of each original parameter in the unsharded flat parameter (padding left
    out), in the order of `FSDPParamInfo.param_indices`."""
    spans, offset = [], 0
    for numel, is_padding in zip(flat_param._numels_with_padding, flat_param._is_padding_mask,
                                 strict=True):
        if not is_padding:
            spans.append((offset, offset + numel))
        offset += numel
    return spans


def local_numel(flat_param: Any, index: int, peer: int) -> int:
    """Elements of original parameter `index` in rank `peer`'s shard of `flat_param` (FSDP1
    FULL_SHARD: the padded flat parameter is split into equal contiguous shards)."""
    shard = flat_param._sharded_size.numel()
    low, high = peer * shard, (peer + 1) * shard
    start, end = _param_spans(flat_param)[index]
    return max(0, min(end, high) - max(start, low))


def _optim_keys(frame: FrameType, mine: Any, peer: int) -> Any:
    """`_map_param_key_to_optim_keys(merge_keys=True)`: the `_OptimStateKey`s of the
    parameters `peer` keeps optimizer state for. A parameter outside FSDP is replicated (the
    peer has state where this rank has); one in a flat parameter has state on the peer where it
    trains (requires grad) and the peer's shard holds part of it, once the optimizer stepped."""
    local = frame.f_locals
    state, by_key = local["optim_state_dict"]["state"], local["param_key_to_param"]
    to_fqns, infos = local["param_to_fqns"], local["fqn_to_fsdp_param_info"]
    key_type = type(mine[0]) if mine else None
    if key_type is None:
        raise LookupError("no optimizer state on this rank to model the peer's on")
    stepped = bool(state)
    keys = []
    for param_key, param in by_key.items():
        fqns = to_fqns[param]
        info = infos.get(fqns[0])
        if info is None:
            if param_key in state:
                keys.append(key_type(unflat_param_names=tuple(fqns), is_fsdp_managed=False))
            continue
        index = info.param_indices[fqns[0]]
        if stepped and info.param_requires_grad[index] and \
                local_numel(info.handle.flat_param, index, peer) > 0:
            keys.append(key_type(unflat_param_names=tuple(fqns), is_fsdp_managed=True))
    return keys


def _state_info(frame: FrameType, mine: Any, peer: int) -> Any:
    """`_allgather_state_info`: for each parameter, the shapes of the peer's local state (1-D,
    its part of the parameter), its scalar (`step`) and other values as this rank's."""
    caller = frame.f_back
    info = caller.f_locals.get("fsdp_param_info") if caller is not None else None
    if info is None:
        raise LookupError("no FSDPParamInfo in the caller")
    flat_param = info.handle.flat_param
    templates = [state for state in mine.values() if state.tensors]
    if not templates:
        raise LookupError("no local optimizer state to model the peer's on")
    peer_states = {}
    for fqn, own in mine.items():
        numel = local_numel(flat_param, info.param_indices[fqn], peer)
        template = own if own.tensors else templates[0]
        if numel == 0:
            peer_states[fqn] = type(own)({}, {}, {})
            continue
        tensors = {name: tensor_info._replace(shape=_size(numel))
                   for name, tensor_info in template.tensors.items()}
        peer_states[fqn] = type(own)(tensors, dict(template.scalar_tensors),
                                     dict(template.non_tensors))
    return peer_states


def _size(numel: int) -> Any:
    import torch

    return torch.Size([numel])


PEER_ANSWERS: dict[tuple[str, str], PeerAnswer] = {
    ("torch.distributed.fsdp._optim_utils", "_map_param_key_to_optim_keys"): _optim_keys,
    ("torch.distributed.fsdp._optim_utils", "_allgather_state_info"): _state_info,
}
"""(module, function) of the caller of the object collective -> its peers' objects."""


def answer_for(frame: FrameType | None) -> PeerAnswer | None:
    """The registry's answer for the function of `frame`, if any."""
    if frame is None:
        return None
    return PEER_ANSWERS.get((frame.f_globals.get("__name__", ""), frame.f_code.co_name))


def fill_peers(objects: list[Any], frame: FrameType | None, mine: Any, rank: int) -> None:
    """Replace the peers' entries of a gathered list (each a copy of this rank's object) by
    what the registry answers for the calling function; entries it cannot tell stay."""
    answer = answer_for(frame)
    if answer is None:
        return
    for peer in range(len(objects)):
        if peer == rank:
            continue
        try:
            objects[peer] = answer(frame, mine, peer)
        except (LookupError, AttributeError, KeyError, TypeError, IndexError) as exc:
            _note_unknown(frame, exc)
            return


def _note_unknown(frame: FrameType, exc: Exception) -> None:
    """Say that the peers' objects are copies of this rank's where they should differ."""
    from peakmem.capture.running_session import session_on_mode_stack as current_session

    session = current_session()
    if session is None:
        return
    note = (f"torch.distributed: the other ranks' objects gathered by {frame.f_code.co_name} "
            f"could not be worked out ({type(exc).__name__}: {exc}); each is this rank's copy, "
            "as if every rank held the same part of the model")
    if note not in session.notes:
        session.notes.append(note)


def caller_frame(depth: int = 2) -> FrameType | None:
    """The frame of whoever called the collective (`depth` 2: the caller of the function that
    calls this)."""
    try:
        return sys._getframe(depth)
    except ValueError:
        return None
