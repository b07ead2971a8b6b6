"""Buffers of collectives labelled `communication`, at the call that makes them.

In a distributed job the wrappers allocate memory that holds neither the model's state nor its
activations: buffers that collectives read and write. The phase tracker tagged them by when they
were made: `other` in a constructor, `temporary` and then `activation` in a forward, `temporary`
in a backward, so "activation" grew with the world size. Here each call that makes such buffers
is wrapped, the allocations made during the call (kept or freed in it) are tagged
`communication`, and the call's behaviour is unchanged (:func:`made_during`):

- DDP: c10d's `Reducer`, built in `DistributedDataParallel.__init__` and rebuilt by
  `_rebuild_buckets` at the first iteration (capture.fake_distributed's Reducer). With the
  default `gradient_as_bucket_view=False` each bucket is one flat tensor of its parameters'
  gradients (`bucket_cap_mb`, 25 MiB by default, the first bucket 1 MiB), alive for the whole
  run next to the parameters' own `.grad`: a second copy of the gradients. The bucket-order and
  parameter-sync broadcasts (`dist._broadcast_coalesced`) flatten their tensors the same way.
- FSDP2: `foreach_all_gather` (the all-gather output, world x the group's padded shard, kept
  until the copy-out) and `foreach_reduce` (the reduce-scatter input, kept until the next
  reduce-scatter, and its output).
- FSDP1: `FlatParamHandle._alloc_padded_unsharded_flat_param` (the padded unsharded flat
  parameter the all-gather writes into: the module's parameters are views of it while unsharded,
  as FSDP2's are of its own copy-out) and `_reduce_grad` (the padded copy of the flat gradient
  the reduce-scatter reads, when the world size does not divide it; the flat gradient itself is
  autograd's, and the sharded gradient the reduce-scatter writes is the FlatParameter's `.grad`).
- NCCL's flattened buffer of a list all-gather / reduce-scatter (`newLikeFlat`,
  capture.fake_distributed).

`gradient` stays the bytes of the parameters' `.grad`: when a gradient is a view of such a
buffer, the buffer is the gradient's storage and is tagged `gradient` where gradients are
classified (the end of a backward, an optimizer's step: capture.phases). That is what happens
with `gradient_as_bucket_view=True`: after the first backward every `.grad` is a view of its
bucket, there is no second copy, and the buckets are `gradient` (a bucket no gradient views yet,
before the first backward, stays `communication`). So the breakdowns of the two settings differ
by what the default costs on top: one `communication` copy of the gradients. FSDP2's sharded
gradients are views of the reduce-scatter output (or a cast of it): `gradient` as well.

Only allocations still tagged input / temporary / other (or `activation`, an evaluation's
forward's default) move (nothing the tracker classified is overridden), and none made in an optimizer step (an optimizer run from a post-accumulate-grad
hook inside `foreach_reduce`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from peakmem.capture.library_patches import register_library_patch
from peakmem.capture.on_import import Undo, patch_on_import
from peakmem.trace.vocab import Category, Phase

COMMUNICATION = Category.COMMUNICATION.value
UNCLASSIFIED = (Category.INPUT.value, Category.TEMPORARY.value, Category.OTHER.value,
                Category.ACTIVATION.value)
"""What a collective's new blocks are tagged by their phase: `activation` is an evaluation's
forward's default (capture.phases: FSDP's all-gathers while a model in eval mode runs under
no_grad); no collective call spans the start of a backward, where a training forward's blocks
become activations."""


def _session() -> Any:
    from peakmem.capture.running_session import session_on_mode_stack

    session = session_on_mode_stack()
    if session is None:  # a hook run where the mode stack is not this thread's: the fake group's
        from peakmem.capture.fake_distributed import running_session

        session = running_session()
    return None if session is None or session.closed else session


@contextmanager
def made_during(category: str = COMMUNICATION, session: Any = None) -> Iterator[None]:
    """The allocations made inside the block (still live or freed in it) are tagged `category`
    when it ends, unless the tracker already classified them (see the module's docstring).
    Nothing happens outside a capture."""
    session = session if session is not None else _session()
    if session is None or session.closed:
        yield
        return
    start = len(session.trace)
    try:
        yield
    finally:
        if not session.closed:
            session.reclassify_made_since(start, category, only_from=UNCLASSIFIED,
                                          skip_phases=(Phase.OPTIMIZER.value,))


def tag_communication(tensor: Any, session: Any = None) -> None:
    """Tag one buffer a collective made (NCCL's `newLikeFlat`) `communication`."""
    session = session if session is not None else _session()
    if session is not None and not session.closed:
        session.classify(tensor, COMMUNICATION, only_from=UNCLASSIFIED)


def communicating(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function`, whose allocations are tagged `communication` (see :func:`made_during`)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        with made_during():
            return function(*args, **kwargs)

    call.__wrapped__ = function  # type: ignore[attr-defined]
    call.__name__ = getattr(function, "__name__", "call")
    call.__qualname__ = getattr(function, "__qualname__", call.__name__)
    call.__doc__ = getattr(function, "__doc__", None)
    return call


def _wrap_calls(owner_name: str | None, names: tuple[str, ...]) -> Callable[[Any], Undo]:
    """Wrap `names` of the module (or of its class `owner_name`) with :func:`communicating`."""

    def apply(module: Any) -> Undo:
        owner = module if owner_name is None else getattr(module, owner_name, None)
        originals = {name: vars(owner)[name] for name in names
                     if owner is not None and callable(vars(owner).get(name))}
        for name, original in originals.items():
            setattr(owner, name, communicating(original))

        def undo() -> None:
            for name, original in originals.items():
                setattr(owner, name, original)

        return undo

    return apply


COLLECTIVE_CALLS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    # FSDP2: FSDPParamGroup calls them by the names its module imported
    "torch.distributed.fsdp._fully_shard._fsdp_param_group":
        (None, ("foreach_all_gather", "foreach_reduce")),
    # FSDP1: the padded unsharded flat parameter the all-gather writes into (the module's
    # parameters are views of it while unsharded), and the reduce-scatter of the flat gradient
    "torch.distributed.fsdp._flat_param": ("FlatParamHandle", ("_alloc_padded_unsharded_flat_param",)),
    "torch.distributed.fsdp._runtime_utils": (None, ("_reduce_grad",)),
}
"""Module -> (its class or None for module functions, the calls whose allocations are
`communication`)."""


@register_library_patch("fsdp_collective_buffers")
@contextmanager
def fsdp_collective_buffers() -> Iterator[None]:
    with ExitStack() as stack:
        for module, (owner, names) in COLLECTIVE_CALLS.items():
            stack.enter_context(patch_on_import(module, _wrap_calls(owner, names)))
        yield
