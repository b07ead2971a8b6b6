"""The CUDA random number generators as the job sees them: one device generator (a host
`torch.Generator` standing in for cuda:0's), `torch.cuda.{get,set}_rng_state[_all]`,
`manual_seed[_all]`, `seed[_all]`, `initial_seed`, `torch.cuda.default_generators` and
`torch.Generator(device="cuda")` (its `device` is cuda:0). Fake tensors have no values, so only
the bookkeeping is real: states round-trip, seeds are remembered."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from peakmem.capture.device_specs import is_cuda_spec
from peakmem.capture.session import CaptureSession
from peakmem.cuda_rules.true_device import is_meta

_RealGenerator = torch._C.Generator


class CudaGenerator(_RealGenerator):
    """A generator that reports `cuda:0` as its device; a host generator underneath (fake
    device tensors have no values to draw)."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


class _GeneratorType(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _RealGenerator)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _RealGenerator)


class FakeGenerator(metaclass=_GeneratorType):
    """`torch.Generator`: a "cuda" generator is a `CudaGenerator`; anything else is the real
    thing."""

    def __new__(cls, device: Any = "cpu") -> Any:  # type: ignore[misc]
        if is_cuda_spec(device):
            return CudaGenerator()
        return _RealGenerator(device)


def patches(session: CaptureSession) -> dict[tuple[Any, str], Any]:
    generator = CudaGenerator()
    generator.manual_seed(torch.initial_seed())
    generators = (generator,)

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return generator.get_state()

    def get_rng_state_all() -> list[torch.Tensor]:
        return [generator.get_state()]

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        if isinstance(new_state, torch.Tensor) and not is_meta(new_state):
            generator.set_state(new_state)

    def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
        for state in new_states:
            set_rng_state(state)

    def manual_seed(seed: int) -> None:
        generator.manual_seed(int(seed))

    def seed() -> None:
        generator.seed()

    def initial_seed() -> int:
        return generator.initial_seed()

    found: dict[tuple[Any, str], Any] = {}
    for owner in (torch.cuda, torch.cuda.random):
        found.update(
            {
                (owner, "get_rng_state"): get_rng_state,
                (owner, "get_rng_state_all"): get_rng_state_all,
                (owner, "set_rng_state"): set_rng_state,
                (owner, "set_rng_state_all"): set_rng_state_all,
                (owner, "manual_seed"): manual_seed,
                (owner, "manual_seed_all"): manual_seed,
                (owner, "seed"): seed,
                (owner, "seed_all"): seed,
                (owner, "initial_seed"): initial_seed,
            }
        )
    found[(torch.cuda, "default_generators")] = generators
    cpu_set_rng_state = torch.random.set_rng_state
    for owner in (torch, torch.random):
        found[(owner, "set_rng_state")] = _with_real_state(cpu_set_rng_state)
    found[(torch, "Generator")] = FakeGenerator
    return found


def _with_real_state(set_state: Any) -> Any:
    """`torch.set_rng_state` / `torch.random.set_rng_state` given a state the capture keeps
    fake (a `torch.load`ed checkpoint's tensors are host-deferred until read: the HF Trainer's
    `rng_state.pth` on resume, accelerate's `load_state`): its values are read (`tolist`, which
    the deferral answers from the file) into a real host tensor first, as the C++ generator
    accepts nothing else ("RNG state must be a torch.ByteTensor")."""

    def set_rng_state(new_state: torch.Tensor) -> None:
        if isinstance(new_state, torch.Tensor) and is_meta(new_state):
            new_state = torch.tensor(new_state.tolist(), dtype=new_state.dtype, device="cpu")
        set_state(new_state)

    return set_rng_state
