"""host_deferred.outputs_kind (the recorder's question on every op: what an op's new meta
storages stand for) walks the arguments itself and stops at the first device tensor: the same
answer as the walk over every tensor `tensors_in` finds, for any mix of device, host-deferred,
the job's own meta, sparse, real host and subclass tensors nested in any containers."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from peakmem.capture.arg_tensors import tensors_in
from peakmem.capture.host_deferred import DEVICE, HOST, META, outputs_kind


class Marked(torch.Tensor):
    """A tensor subclass (found through the pytree walk, its device read with `.device`)."""


def _reference(session, args: tuple, kwargs: dict) -> tuple[str, str | None]:
    """outputs_kind as written before the early-exit walk (every tensor of tensors_in)."""
    kinds = session.storage_kinds
    if not kinds:
        return DEVICE, None
    found = set()
    for tensor in tensors_in((args, kwargs)):
        if tensor.is_meta if type(tensor) in (torch.Tensor, torch.nn.Parameter) else (
                tensor.device.type == "meta"):
            if tensor.layout != torch.strided:
                return DEVICE, None
            kind = kinds.get(id(tensor.untyped_storage()), DEVICE)
            if kind == DEVICE:
                return DEVICE, None
            found.add(kind)
    if HOST in found:
        return HOST, None
    if META in found:
        return META, None
    return DEVICE, None


Pair = collections.namedtuple("Pair", "first second")
_KINDS = ("device", "host", "meta", "sparse", "cpu", "subclass-host", "subclass-device",
          "parameter-host")


def _tensor(kind: str, kinds: dict, keep: list) -> torch.Tensor:
    if kind == "sparse":
        tensor = torch.sparse_coo_tensor(torch.empty(2, 0, dtype=torch.long, device="meta"),
                                         torch.empty(0, device="meta"), (2, 2))
    elif kind == "cpu":
        tensor = torch.zeros(2)
    else:
        tensor = torch.empty(3, device="meta")
        if kind.startswith("subclass"):
            tensor = tensor.as_subclass(Marked)
        if kind.startswith("parameter"):
            tensor = torch.nn.Parameter(tensor)
        if kind.endswith("host"):
            kinds[id(tensor.untyped_storage())] = HOST
        elif kind == "meta":
            kinds[id(tensor.untyped_storage())] = META
    keep.append(tensor)
    return tensor


_TREES = st.recursive(
    st.one_of(st.sampled_from(_KINDS).map(lambda kind: ("tensor", kind)),
              st.sampled_from([1, 2.5, None, "x", torch.float16, torch.device("meta")])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from("abc"), inner, max_size=3),
        st.tuples(inner, inner).map(lambda pair: Pair(*pair)),
    ),
    max_leaves=8,
)


def _build(tree, kinds: dict, keep: list):
    if type(tree) is tuple and len(tree) == 2 and tree[0] == "tensor" and tree[1] in _KINDS:
        return _tensor(tree[1], kinds, keep)
    if isinstance(tree, Pair):
        return Pair(*(_build(item, kinds, keep) for item in tree))
    if isinstance(tree, list):
        return [_build(item, kinds, keep) for item in tree]
    if isinstance(tree, tuple):
        return tuple(_build(item, kinds, keep) for item in tree)
    if isinstance(tree, dict):
        return {name: _build(item, kinds, keep) for name, item in tree.items()}
    return tree


@settings(max_examples=100, deadline=None)  # worked cases: test_each_answer_is_reached
@given(st.lists(_TREES, max_size=4), st.dictionaries(st.sampled_from(["out", "other"]), _TREES,
                                                     max_size=2), st.booleans())
def test_the_early_exit_walk_answers_as_the_full_walk(args, kwargs, marked_elsewhere):
    kinds: dict[int, str] = {}
    keep: list = []
    if marked_elsewhere:  # a host storage the op does not read: the kinds are not empty
        kinds[id(_tensor("meta", {}, keep).untyped_storage())] = HOST
    built_args = tuple(_build(tree, kinds, keep) for tree in args)
    built_kwargs = {name: _build(tree, kinds, keep) for name, tree in kwargs.items()}
    session = SimpleNamespace(host_deferral=SimpleNamespace(making=None, moving=False),
                              storage_kinds=kinds)
    assert outputs_kind(session, built_args, built_kwargs) == _reference(
        session, built_args, built_kwargs)


def test_each_answer_is_reached():
    """The three answers, and the device answer from a tensor behind host ones, in a nested
    list, in kwargs and inside a namedtuple."""
    kinds: dict[int, str] = {}
    keep: list = []
    host, meta = _tensor("host", kinds, keep), _tensor("meta", kinds, keep)
    device, sub = _tensor("device", kinds, keep), _tensor("subclass-device", kinds, keep)
    session = SimpleNamespace(host_deferral=SimpleNamespace(making=None, moving=False),
                              storage_kinds=kinds)
    assert outputs_kind(session, (host, [meta]), {}) == (HOST, None)
    assert outputs_kind(session, (meta, 3), {}) == (META, None)
    assert outputs_kind(session, (host, [[meta, device]]), {}) == (DEVICE, None)
    assert outputs_kind(session, (host,), {"out": device}) == (DEVICE, None)
    assert outputs_kind(session, (host, Pair(meta, sub)), {}) == (DEVICE, None)
    assert outputs_kind(session, (host, Pair(meta, 1)), {}) == (HOST, None)
