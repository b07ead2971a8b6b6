"""The real values of host-deferred tensors (capture.host_deferred), computed only when the job
needs them.

Each host-deferred storage has a recipe: `base()` makes a real host tensor with the storage's
bytes (the factory call that made it, replayed on the host; a read of a loaded checkpoint; the op
that derived it, replayed on its inputs' values), then the in-place ops applied to the storage
since (`normal_`, `fill_`, `nn.init.*`, `copy_`, ...) are replayed on views of it with the
geometry they ran on. No recipe, or a replay that fails: zeros. Values a host optimizer later
wrote to the fake tensor are not followed.

A storage's values are computed once, on its first read, and kept (with the storage): later
reads apply only the in-place ops recorded since, so a loop reading a host tensor N times
replays O(N) ops, not O(N^2) (`nn.init.trunc_normal_` redraws rejected values in such a loop).
A kept storage about to be written in place first has the storages derived from it and not
computed yet computed from its values as they are then.
Replays draw random numbers from their own stream (seeded from the job's initial seed), which
advances from one replay to the next as the job's would: a value drawn after a read differs
from one drawn before (with a stream reset for every replay, `trunc_normal_`'s redraws repeated
the rejected values and never ended). The job's own random number stream is not moved.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map

from peakmem.capture.replaced_methods import ORIGINAL

Tensor = torch.Tensor
_NO_MODES = torch._C.DisableTorchFunction
_SELF = object()
"""Where an in-place step's own tensor goes in its recorded arguments."""
MAX_STEPS = 64
"""In-place ops recorded per storage between two reads at most; beyond, its values read as zeros."""
EMPTY_FACTORIES = {torch.empty, torch.empty_like, torch.empty_strided, Tensor.new_empty}
PRUNE_DEPENDENTS = 256
"""Dependents noted per storage between prunings of those that died or were computed."""
REPLAY_SEED_SALT = 0x5EED_0F_4E_91A7
"""XORed into the job's initial seed to seed the replays' random stream."""


@dataclass
class Recipe:
    base: Callable[[], Tensor] | None
    steps: list[tuple[Any, tuple, tuple, dict]] = field(default_factory=list)
    """(func, (storage_offset, size, stride, dtype) of the view it ran on, args, kwargs), the
    view's place in args / kwargs held by _SELF."""
    loaded: bool = False
    """The values come from a checkpoint (reads are not placeholders)."""
    values: Tensor | None = None
    """The storage's real bytes once computed (`steps` then holds the ops recorded since)."""
    zeros: bool = False
    """`values` are zeros (nothing recorded, or the replay failed)."""
    counted: bool = False
    """The storage's read was counted in ReadStats (each storage once)."""

    def reset(self, *, loaded: bool = False) -> None:
        """The storage's values are made over (a full `copy_`, too many writes): forget them."""
        self.base, self.steps, self.loaded, self.values, self.zeros = None, [], loaded, None, False


@dataclass
class ReadStats:
    recomputed: int = 0
    zeros: int = 0
    loaded: int = 0


def _storage_id(tensor: Tensor) -> int:
    return id(tensor.untyped_storage())


class HostValues:
    """Recipes of host-deferred storages, by id(untyped storage). `is_deferred(value)` says
    whether a value is a host-deferred tensor (the deferral mode's storage kinds)."""

    def __init__(self, is_deferred: Callable[[Any], bool]) -> None:
        self.is_deferred = is_deferred
        self.recipes: dict[int, Recipe] = {}
        self.reads = ReadStats()
        self._replay_rng: Tensor | None = None
        """The replays' random generator state between replays (None: not seeded yet)."""
        self._replaying = 0
        self._dependents: dict[int, list[tuple[int, weakref.ref[Recipe], int]]] = {}
        """Storages derived from a storage and not computed yet: (key, recipe, nbytes)."""

    def forget(self, key: int) -> None:
        self.recipes.pop(key, None)
        self._dependents.pop(key, None)

    # -- recording -----------------------------------------------------------------------------
    def made_by(self, tensor: Tensor, func: Any, args: tuple, real_kwargs: dict) -> None:
        """`tensor` was made by the host factory call `func(*args, **real_kwargs)`."""
        if func in EMPTY_FACTORIES:  # uninitialised memory: zeros (no NaNs from garbage)
            self.recipes[_storage_id(tensor)] = Recipe(lambda: func(*args, **real_kwargs).zero_())
        else:
            self.recipes[_storage_id(tensor)] = Recipe(lambda: func(*args, **real_kwargs))

    def read_from(self, tensor: Tensor, read: Callable[[], Tensor]) -> None:
        """`tensor`'s values are `read()` (a checkpoint's)."""
        self.recipes[_storage_id(tensor)] = Recipe(read, loaded=True)

    def in_place(self, func: Any, target: Tensor, args: tuple, kwargs: dict) -> None:
        """`func(*args, **kwargs)` changed `target` (a host-deferred tensor) in place."""
        with _NO_MODES():
            key = _storage_id(target)
            geometry = (target.storage_offset(), tuple(target.size()), tuple(target.stride()),
                        target.dtype)
        recipe = self.recipes.setdefault(key, Recipe(None))
        if recipe.values is not None:
            self._settle_dependents(key)
        if func is ORIGINAL["copy_"] and _covers_storage(target):
            source = args[1] if len(args) > 1 else kwargs.get("src")
            recipe.reset(loaded=self.is_loaded(source))
        if len(recipe.steps) >= MAX_STEPS:  # a buffer written over and over: not replayed
            recipe.reset()
            return
        template = tree_map(lambda v: _SELF if v is target else v, (args, kwargs))
        recipe.steps.append((func, geometry, template[0], template[1]))

    def derived(self, func: Any, args: tuple, kwargs: dict, out: Any, before: set[int]) -> None:
        """Note how to compute the new host-deferred storages in `out` (those not in `before`)
        from `func`'s inputs."""
        flat, _ = tree_flatten(out)
        for index, tensor in enumerate(flat):
            if not self.is_deferred(tensor):
                continue
            with _NO_MODES():
                key = _storage_id(tensor)
            if key in before or key in self.recipes:
                continue

            def base(index: int = index) -> Tensor:
                real_args, real_kwargs = tree_map(self._step_arg, (args, kwargs))
                return tree_flatten(func(*real_args, **real_kwargs))[0][index]

            inputs = tree_flatten((args, kwargs))[0]
            recipe = self.recipes[key] = Recipe(
                base, loaded=any(self.is_loaded(arg) for arg in inputs)
            )
            with _NO_MODES():
                nbytes = tensor.untyped_storage().nbytes()
                sources = {_storage_id(arg) for arg in inputs if self.is_deferred(arg)}
            for source in sources:
                dependents = self._dependents.setdefault(source, [])
                dependents.append((key, weakref.ref(recipe), nbytes))
                if len(dependents) % PRUNE_DEPENDENTS == 0:  # a source used in a long loop
                    dependents[:] = [entry for entry in dependents if _pending(entry)]

    def _settle_dependents(self, key: int) -> None:
        """Storage `key`, whose values are kept, is about to be written: compute the storages
        derived from it and not computed yet from its values as they are now (a derived value
        is otherwise computed from its inputs as they are when it is read)."""
        for dependent, recipe_ref, nbytes in self._dependents.pop(key, ()):
            recipe = recipe_ref()
            if recipe is not None and recipe.values is None and (
                self.recipes.get(dependent) is recipe
            ):
                self._values(recipe, nbytes)

    def is_loaded(self, value: Any) -> bool:
        if not self.is_deferred(value):
            return False
        with _NO_MODES():
            recipe = self.recipes.get(_storage_id(value))
        return recipe is not None and recipe.loaded

    # -- computing -----------------------------------------------------------------------------
    def materialize(self, tensor: Tensor, *, count: bool = True) -> Tensor:
        """A real host tensor with a host-deferred tensor's values: computed on the storage's
        first read and kept; the in-place ops recorded since are applied to the kept values."""
        with _NO_MODES():
            storage = tensor.untyped_storage()
            nbytes = storage.nbytes()
            offset, size, stride = tensor.storage_offset(), tensor.size(), tensor.stride()
            dtype = tensor.dtype
        recipe = self.recipes.setdefault(id(storage), Recipe(None))
        real = self._values(recipe, nbytes)
        if count and not recipe.counted:
            recipe.counted = True
            if recipe.zeros:
                self.reads.zeros += 1
            elif recipe.loaded:
                self.reads.loaded += 1
            else:
                self.reads.recomputed += 1
        with _NO_MODES():
            return torch.empty(0, dtype=dtype, device="cpu").set_(real.untyped_storage(), offset, size, stride)

    def _values(self, recipe: Recipe, nbytes: int) -> Tensor:
        """The storage's real bytes now: the kept ones with the steps recorded since applied, or
        computed from the recipe (then kept; the recipe's inputs are let go)."""
        with torch.no_grad(), self._replay_stream():
            if recipe.values is None:
                base = self._compute(recipe, nbytes)
                recipe.zeros = base is None
                if base is None:
                    base = torch.zeros(nbytes, dtype=torch.uint8)
                recipe.values, recipe.base, recipe.steps = base, None, []
            elif recipe.steps:
                self._apply(recipe.steps, recipe.values)
                recipe.steps = []
        return recipe.values

    @contextmanager
    def _replay_stream(self) -> Iterator[None]:
        """Random draws inside come from the replays' own stream, which goes on where the last
        replay left it; the job's stream is left as it was (nested replays share the stream)."""
        if self._replaying:
            yield
            return
        with torch.random.fork_rng(devices=[]):
            if self._replay_rng is None:
                seeded = torch.Generator().manual_seed(torch.initial_seed() ^ REPLAY_SEED_SALT)
                self._replay_rng = seeded.get_state()
            torch.set_rng_state(self._replay_rng)
            self._replaying += 1
            try:
                yield
            finally:
                self._replaying -= 1
                self._replay_rng = torch.get_rng_state()

    def _compute(self, recipe: Recipe, nbytes: int) -> Tensor | None:
        try:
            base = recipe.base() if recipe.base is not None else None
        except Exception:  # noqa: BLE001 - a value the replay cannot make: zeros
            base = None
        with _NO_MODES():
            if (
                base is None
                or base.device.type != "cpu"
                or base.untyped_storage().nbytes() != nbytes
            ):
                if not recipe.steps:
                    return None
                base = torch.zeros(nbytes, dtype=torch.uint8)
        self._apply(recipe.steps, base)
        return base

    def _apply(self, steps: list[tuple[Any, tuple, tuple, dict]], base: Tensor) -> None:
        """Replay in-place `steps` on views of `base`'s storage."""
        with _NO_MODES():
            storage = base.untyped_storage()
        for func, (offset, size, stride, dtype), rest, kwargs in steps:
            with _NO_MODES():
                view = torch.empty(0, dtype=dtype, device="cpu").set_(storage, offset, size, stride)
            step_args, step_kwargs = tree_map(
                lambda v, view=view: view if v is _SELF else self._step_arg(v), (rest, kwargs)
            )
            try:
                func(*step_args, **step_kwargs)
            except Exception:  # noqa: BLE001 - keep the values made so far
                continue

    def _step_arg(self, value: Any) -> Any:
        return self.materialize(value, count=False) if self.is_deferred(value) else value


def _pending(entry: tuple[int, weakref.ref[Recipe], int]) -> bool:
    """Whether a dependent storage still lives and is not computed yet."""
    recipe = entry[1]()
    return recipe is not None and recipe.values is None


def _covers_storage(tensor: Tensor) -> bool:
    with _NO_MODES():
        return (
            tensor.storage_offset() == 0
            and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() == tensor.untyped_storage().nbytes()
        )
