"""The GPU inventory `pack` places jobs on, from `--gpus`.

Syntax: comma-separated items, each one of

  [Nx]GPU                      N whole GPUs (default 1):            8xa100-40gb, l4
  [Nx]GPU/SLICE                N MIG slices of one profile:          7xa100-80gb/1g.10gb
  [Nx]GPU:SLICE[+SLICE...]     N GPUs, each cut into these slices:  2xh100-80gb:3g.40gb+2g.20gb+1g.10gb

GPU is a GPU profile name or alias (`peakmem estimate --gpu` names); SLICE a MIG profile that
GPU offers (`mig.py`'s table, NVIDIA's MIG user guide). A GPU cut with `:` must respect the
guide's limits: at most 7 compute sevenths and 8 memory eighths in all, and no profile more
times than its "Number of Instances Available". Slices given with `/` are counted onto as few
GPUs as their per-GPU instance limit allows. Each whole GPU or slice is one bin of `pack`.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from peakmem.profiles import ProfileError, load_gpu
from peakmem.schedule.mig import MigError, load_mig

MAX_BINS = 100_000
_COUNT = re.compile(r"^(\d+)\s*[xX\*]\s*(.+)$")


class InventoryError(ValueError):
    """A `--gpus` value that does not parse (one line saying where)."""


@dataclass(frozen=True)
class Bin:
    """One whole GPU or one MIG slice."""

    gpu: str
    """GPU profile name."""
    device: int
    """Which physical GPU of the inventory it is on (0, 1, ... in inventory order)."""
    capacity_bytes: int
    mig: str | None = None
    """MIG profile name, or None for a whole GPU."""

    @property
    def label(self) -> str:
        return f"{self.gpu}/{self.mig}" if self.mig else self.gpu


def parse_inventory(text: str) -> list[Bin]:
    """The bins of a `--gpus` value, in order; InventoryError for anything malformed."""
    items = [item.strip() for item in str(text).split(",")]
    if not any(items):
        raise InventoryError("--gpus is empty; e.g. --gpus 8xa100-40gb,2xl4")
    bins: list[Bin] = []
    device = 0
    for item in items:
        if not item:
            raise InventoryError(f"--gpus {text!r}: an empty item between commas")
        try:
            made, device = _item(item, device)
        except (ProfileError, MigError) as exc:
            raise InventoryError(f"--gpus item {item!r}: {exc}") from None
        bins.extend(made)
        if len(bins) > MAX_BINS:
            raise InventoryError(f"--gpus describes more than {MAX_BINS} GPUs and slices")
    return bins


def _item(item: str, device: int) -> tuple[list[Bin], int]:
    count = 1
    match = _COUNT.match(item)
    if match:
        count, item = int(match.group(1)), match.group(2).strip()
        if count < 1 or count > MAX_BINS:
            raise InventoryError(f"--gpus: count {count} must be between 1 and {MAX_BINS}")
    if "/" in item:
        name, _, slice_name = item.partition("/")
        gpu = load_gpu(name)
        mig = load_mig(gpu, slice_name)
        bins = [
            Bin(gpu.name, device + i // mig.max_instances, mig.capacity_bytes, mig.name)
            for i in range(count)
        ]
        return bins, device + -(-count // mig.max_instances)
    if ":" in item:
        name, _, layout = item.partition(":")
        gpu = load_gpu(name)
        slices = [load_mig(gpu, part) for part in layout.split("+")]
        compute = sum(m.compute_sevenths for m in slices)
        memory = sum(m.memory_eighths for m in slices)
        if compute > 7 or memory > 8:
            raise InventoryError(
                f"--gpus item {item!r}: the slices need {compute}/7 of the SMs and "
                f"{memory}/8 of the memory of one {gpu.name}; at most 7/7 and 8/8 fit"
            )
        for mig_name, used in Counter(m.name for m in slices).items():
            limit = next(m.max_instances for m in slices if m.name == mig_name)
            if used > limit:
                raise InventoryError(
                    f"--gpus item {item!r}: {used} x {mig_name}, but one {gpu.name} holds at "
                    f"most {limit}"
                )
        bins = [
            Bin(gpu.name, device + d, m.capacity_bytes, m.name)
            for d in range(count)
            for m in slices
        ]
        return bins, device + count
    gpu = load_gpu(item)
    return [Bin(gpu.name, device + d, gpu.total_memory_bytes) for d in range(count)], device + count
