"""Measured cuDNN convolution workspaces per shape (`data/cudnn_workspace/*.csv.gz`).

A table holds, for every benchmark-off case of a cuDNN grid measured on one GPU architecture and
cuDNN version (benchmarks/cudnn_probe.py), the workspace bytes the heuristic plan took in each
direction. It is made from the raw grid by benchmarks/make_cudnn_workspace_table.py (each number
is the grid row's `workspace_bytes`) and chosen per GPU by a stack profile's
`[cudnn_workspace_table.<gpu>]` entry.

`lookup` answers a convolution exactly where the table has its shape, dtype mode and layout, and
otherwise from its nearest measured neighbours: among the cases of the same direction, dtype mode,
layout and kernel class, the `NEIGHBOURS` closest in log feature space (batch, channels, spatial
size, kernel, stride, dilation, and the channel counts' alignment), whose inverse-distance-
weighted median workspace per byte of x + y + w is scaled to the call's x + y + w. The held-out
accuracy of that fallback (grid shapes split by a hash of the shape) is printed by the script
that makes the table and reported in docs/cnn.md.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import heapq
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

DIRECTIONS = ("forward", "backward_data", "backward_weight", "backward_bias")
DTYPE_MODES = ("fp32", "tf32", "bf16", "fp16")
LAYOUTS = ("nchw", "channels_last")
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
SHAPE_COLUMNS = ("n", "cin", "h", "w", "cout", "kernel", "stride", "padding", "dilation", "groups")
TABLE_COLUMNS = (*SHAPE_COLUMNS, "dtype_mode", "layout", "backend", *DIRECTIONS)
"""The table file's columns: the shape, the setting, the backend torch chose, the bytes per
direction (empty: the direction was not measured, e.g. backward_bias without a bias)."""
NEIGHBOURS = 5
DISTANCE_FLOOR = 0.3
"""Added to each neighbour's distance before weighting by its inverse: a case a step away
counts a few times more than one across the group, never infinitely more."""


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution as the grid describes it (square kernel, stride, padding, dilation)."""

    n: int
    cin: int
    h: int
    w: int
    cout: int
    kernel: int
    stride: int
    padding: int
    dilation: int
    groups: int
    dtype_mode: str
    layout: str

    @property
    def key(self) -> tuple:
        return (*(getattr(self, c) for c in SHAPE_COLUMNS), self.dtype_mode, self.layout)

    def out_hw(self) -> tuple[int, int]:
        span = self.dilation * (self.kernel - 1) + 1
        return tuple(  # type: ignore[return-value]
            max(1, (size + 2 * self.padding - span) // self.stride + 1) for size in (self.h, self.w))

    @property
    def tensor_bytes(self) -> int:
        """x + y + w at the dtype: what the fallback's ratios are per."""
        oh, ow = self.out_hw()
        elements = (self.n * self.cin * self.h * self.w + self.n * self.cout * oh * ow
                    + self.cout * (self.cin // max(1, self.groups)) * self.kernel ** 2)
        return elements * ELEMENT_BYTES[self.dtype_mode]

    @property
    def kernel_class(self) -> str:
        if self.groups > 1 and self.groups == self.cin:
            return "depthwise"
        if self.groups > 1:
            return "grouped"
        if self.cin <= 4:
            return "stem"
        return "pointwise" if self.kernel == 1 else "spatial"

    def features(self) -> tuple[float, ...]:
        oh, ow = self.out_hw()
        return (math.log2(self.n), math.log2(self.cin / self.groups), math.log2(self.cout),
                math.log2(self.h * self.w) / 2, math.log2(oh * ow) / 2, math.log2(self.kernel),
                math.log2(self.stride), math.log2(self.dilation), math.log2(self.groups),
                channel_alignment(self.cin // self.groups), channel_alignment(self.cout))


def channel_alignment(channels: int, cap: int = 3) -> int:
    """How many times 2 divides a channel count, up to `cap` (8 channels): cuDNN's tensor-core
    engines load channels in aligned vectors, so a layer of 63 -> 71 channels picks other plans
    (and workspaces) than one of 64 -> 64 with the same sizes."""
    twos = 0
    while channels and channels % 2 == 0 and twos < cap:
        channels //= 2
        twos += 1
    return twos


def shape_hash(shape: ConvShape) -> int:
    """A stable hash of the shape alone (not the setting): the held-out split's key."""
    text = "x".join(str(getattr(shape, c)) for c in SHAPE_COLUMNS)
    return int(hashlib.sha1(text.encode()).hexdigest(), 16)


@dataclass(frozen=True)
class Measured:
    shape: ConvShape
    backend: str
    bytes: dict[str, int]


@dataclass(frozen=True)
class Answer:
    bytes: int
    how: str  # "exact" or "nearest"


class WorkspaceTable:
    """Exact lookup plus the nearest-neighbour fallback over one table's cases."""

    def __init__(self, cases: Iterable[Measured]):
        self.cases = list(cases)
        self._exact = {case.shape.key: case for case in self.cases}
        self._groups: dict[tuple, list[tuple[tuple[float, ...], float]]] = {}
        for case in self.cases:
            if case.backend != "Cudnn":
                continue
            features, tensor_bytes = case.shape.features(), case.shape.tensor_bytes
            for direction, size in case.bytes.items():
                self._groups.setdefault(self._group(case.shape, direction), []).append(
                    (features, size / tensor_bytes))
        self._wide: dict[tuple, list[tuple[tuple[float, ...], float]]] = {}
        for (direction, mode, layout, _kind), members in self._groups.items():
            self._wide.setdefault((direction, mode, layout), []).extend(members)

    @staticmethod
    def _group(shape: ConvShape, direction: str) -> tuple:
        return (direction, shape.dtype_mode, shape.layout, shape.kernel_class)

    def exact(self, shape: ConvShape, direction: str) -> int | None:
        case = self._exact.get(shape.key)
        return None if case is None else case.bytes.get(direction)

    def backend(self, shape: ConvShape) -> str | None:
        case = self._exact.get(shape.key)
        return None if case is None else case.backend

    def nearest(self, shape: ConvShape, direction: str, quantile: float = 0.5,
                batch_exponent: float = 0.0) -> int:
        """The fallback: the neighbours' inverse-distance-weighted median workspace per byte of
        x + y + w, times the call's x + y + w (so linear in the batch, past the grid's largest
        too). `quantile` and `batch_exponent` (each neighbour's ratio x (n / its n) ** exponent
        where the call's batch is larger) are the alternatives the grid's batch split scores
        (peakmem.profiles.conv_workspace_batch_split); the rule uses the defaults."""
        members = self._groups.get(self._group(shape, direction), [])
        if len(members) < NEIGHBOURS:
            members = self._wide.get((direction, shape.dtype_mode, shape.layout), [])
        if not members:
            return 0
        here = shape.features()
        closest = heapq.nsmallest(NEIGHBOURS, members, key=lambda m: math.dist(m[0], here))
        if batch_exponent:
            closest = [(f, ratio * 2 ** (batch_exponent * max(0.0, here[0] - f[0])))
                       for f, ratio in closest]
        weighted = sorted((ratio, 1 / (math.dist(f, here) + DISTANCE_FLOOR)) for f, ratio in closest)
        cut, seen = sum(w for _r, w in weighted) * quantile, 0.0
        for ratio, weight in weighted:  # the inverse-distance-weighted quantile of the ratios
            seen += weight
            if seen >= cut:
                return int(ratio * shape.tensor_bytes)
        return int(weighted[-1][0] * shape.tensor_bytes)

    @lru_cache(maxsize=4096)  # noqa: B019 (tables live as long as the process: load_table caches)
    def lookup(self, shape: ConvShape, direction: str) -> Answer:
        found = self.exact(shape, direction)
        if found is not None:
            return Answer(found, "exact")
        return Answer(self.nearest(shape, direction), "nearest")

    def without(self, keep) -> WorkspaceTable:
        """The table of the cases `keep(case)` accepts (for held-out scoring)."""
        return WorkspaceTable(case for case in self.cases if keep(case))


def parse_table(text: str) -> WorkspaceTable:
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != TABLE_COLUMNS:
        raise ValueError(f"workspace table columns {reader.fieldnames} != {list(TABLE_COLUMNS)}")
    cases = []
    for raw in reader:
        shape = ConvShape(*(int(raw[c]) for c in SHAPE_COLUMNS), raw["dtype_mode"], raw["layout"])
        sizes = {d: int(raw[d]) for d in DIRECTIONS if raw[d] != ""}
        cases.append(Measured(shape, raw["backend"], sizes))
    return WorkspaceTable(cases)


@cache
def load_table(filename: str) -> WorkspaceTable:
    """The packaged table `data/<filename>` (gzip-compressed CSV)."""
    path = resources.files("peakmem.profiles").joinpath("data", filename)
    return parse_table(gzip.decompress(path.read_bytes()).decode("utf-8"))
