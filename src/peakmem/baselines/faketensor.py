"""The naive FakeTensor baseline: peak bytes of live fake tensors over forward +
`output.sum().backward()`, as the GPUMemNet paper ran it.

The model and batch are created under FakeTensorMode (CPU fakes: nothing is allocated or computed);
a TorchDispatchMode sees every op's outputs and tracks each new storage until it is freed
(weakref.finalize on the storage object, which PyTorch keeps alive as long as the storage lives).
No allocator (no rounding, caching or fragmentation), no optimizer, no CUDA context or workspaces:
that is what makes it the naive baseline. Parameters count from creation on.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from peakmem.baselines.base import CannotEstimate, Estimator
from peakmem.baselines.rebuild import rebuild
from peakmem.datasets.rows import BenchRow


class LiveStorageTracker(TorchDispatchMode):
    """Current and peak bytes of storages created by ops seen under this mode."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._seen: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live_bytes -= nbytes

    def track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._seen:
            return
        nbytes = storage.nbytes()
        self._seen.add(key)
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._freed, key, nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.track(leaf)
        return out


def _fake_like(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of the same shape/dtype; a fake one when called under FakeTensorMode."""
    return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")


def fake_model_(model: nn.Module) -> nn.Module:
    """Swap a meta-device model's parameters and buffers for fresh (fake) CPU tensors, in place.

    The model is built on meta and converted, rather than built under FakeTensorMode, because
    deepcopy inside module constructors (nn.TransformerEncoder clones its layer) would create
    fakes of another mode.
    """
    swapped: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in swapped:
                    swapped[id(param)] = nn.Parameter(_fake_like(param), param.requires_grad)
                module._parameters[name] = swapped[id(param)]
        for name, buf in list(module._buffers.items()):
            if buf is not None:
                module._buffers[name] = _fake_like(buf)
    return model


def naive_fake_peak_bytes(row: BenchRow) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    job = rebuild(row, "meta")
    tracker = LiveStorageTracker()
    with warnings.catch_warnings(), FakeTensorMode(), tracker:
        warnings.simplefilter("ignore")  # "Accessing the data pointer of FakeTensor" notices
        model = fake_model_(job.model).train()
        inputs = _fake_like(job.inputs).zero_()
        output = model(inputs)
        output.sum().backward()
    return tracker.peak_bytes


class FakeTensorEstimator(Estimator):
    name = "faketensor"

    def estimate_bytes(self, row: BenchRow) -> int:
        try:
            return naive_fake_peak_bytes(row)
        except CannotEstimate:
            raise
        except (RuntimeError, NotImplementedError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CannotEstimate(f"FakeTensor run failed: {first[:120]}") from exc
