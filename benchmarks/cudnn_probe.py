"""Measure cuDNN convolution workspaces over a grid of shapes and settings (issue 6, item 1).

    PYTHONPATH=src python benchmarks/cudnn_probe.py OUTDIR [--grid small|full] [--budget-s 480]
        [--benchmark off,on] [--dry-run]

Writes OUTDIR/cudnn_grid.csv (schema: peakmem.measure.cudnn_tables.CONV_SCHEMA, documented in
docs/MEASURE.md), one row per case x call x direction, appended and flushed after every case, and
OUTDIR/cudnn_grid.json (versions, plan counts). A case is a conv2d shape (batch, channels in/out,
spatial size, kernel, stride, padding, dilation, groups, bias) x dtype mode (fp32 with TF32 off,
fp32 with TF32 on = "tf32", bf16, fp16) x layout (nchw, channels_last) x cudnn.benchmark.

How a workspace is found. Each case runs the forward (`F.conv2d`) and then the backward
(`torch.autograd.grad(y, [x, w, b], dy)` with a dense dy made beforehand, so no format copy and no
AccumulateGrad clone lands in the window), each inside its own allocator-history window
(`torch.cuda.memory._record_memory_history(context=None)`, cleared per window, then
`_snapshot()`): every allocation in a window is the conv's. An allocation still alive at the end of
the window is an output (y; grad_input, grad_weight, grad_bias); one made and freed inside is a
temporary. The backward is one aten op (`convolution_backward`) that computes grad_input (cuDNN
backward-data), then grad_weight (backward-weight), then grad_bias (a reduction): temporaries are
attributed to the phase of the last output allocated before them (outputs are matched to the
expected grads by size, in that order). A TorchDispatchMode around each window records the aten
op each allocation happened in (by the allocator's cumulative allocation counter before and after
each op), so temporaries of other ops are kept apart (`other_temp_bytes`). The workspace of a
phase is the peak of its concurrently live temporaries (`workspace_bytes`).

cudnn.benchmark off and on run in separate processes: torch's cuDNN plan cache is keyed by the
shape, dtype, layout, TF32 and determinism but not by the benchmark flag, so in one process the
second setting would reuse the first one's plans. Within a process, shapes run back to back
(no process per case), with `torch.cuda.empty_cache()` between cases. With benchmark on, each case
runs twice (call 1 includes the algorithm search, call 2 is the steady state).

Budget: `--budget-s` is the wall time of the whole call. Off gets the first (1 - --on-share) of it
(on gets the rest, plus what off left), no case starts that would not end in time (the estimate is
the slowest of the last cases), and a process still running at its deadline + 15 s is killed; its
current case is left for the next call. Rows already in the CSV are skipped, so the same command
resumes. An OOM or unsupported case is a row with `status` oom / unsupported; a CUDA error that
poisons the context ends the process (its case gets `error`) and a fresh one continues; a case
that crashes the process gets `crashed`.

`--shapes FILE` measures a list of shapes instead of the grid: the `--out` CSV of
benchmarks/conv_table_coverage.py (the workspace table's shape columns, `dtype_mode`, `layout`,
`directions`, `job`), each distinct shape in its own dtype mode and layout, the ones most jobs
listed first, with every `--benchmark` setting as the grid (`read_shapes`; rows `source` =
`shapes`). Same CSV columns, resume and budget as the grid.

`--dry-run` (no GPU needed) writes the plan (OUTDIR/cudnn_grid_plan.csv: every case in priority
order) and a header-only table.
`--device cpu` runs the real loop on the CPU with a synthetic recorder (tests only).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from peakmem.measure.cudnn_tables import (  # noqa: E402
    CONV_COLUMNS,
    CONV_SCHEMA,
    blank_row,
    check_row,
)

TABLE = "cudnn_grid.csv"
PLAN = "cudnn_grid_plan.csv"
MARKER = "cudnn_grid.current"
GPUMEMNET_SHAPES = REPO / "benchmarks" / "data" / "gpumemnet_conv_shapes.csv"
CONV_OPS = frozenset({"convolution", "convolution_backward", "_convolution", "conv2d",
                      "cudnn_convolution", "_conv_depthwise2d", "convolution_overrideable"})  # fmt: skip
# (dtype mode, layout) per shape, most common first
MODES = [("tf32", "nchw"), ("bf16", "nchw"), ("bf16", "channels_last"), ("fp16", "nchw"),
         ("tf32", "channels_last"), ("fp32", "nchw"), ("fp16", "channels_last"),
         ("fp32", "channels_last")]  # fmt: skip
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
KILL_GRACE_S = 15.0


# ------------------------------------------------------------------------------------ the grid


@dataclass(frozen=True)
class ConvShape:
    n: int
    cin: int
    h: int
    w: int
    cout: int
    kernel: int
    stride: int = 1
    padding: int = -1  # -1: "same"-style kernel // 2 * dilation
    dilation: int = 1
    groups: int = 1
    bias: int = 0

    def __post_init__(self) -> None:
        if self.padding < 0:
            object.__setattr__(self, "padding", self.kernel // 2 * self.dilation)

    def out_hw(self) -> tuple[int, int]:
        span = self.dilation * (self.kernel - 1) + 1
        return ((self.h + 2 * self.padding - span) // self.stride + 1,
                (self.w + 2 * self.padding - span) // self.stride + 1)  # fmt: skip

    def valid(self) -> bool:
        if min(self.kernel, self.stride, self.dilation, self.groups) < 1 or self.padding < 0:
            return False  # (out_hw would divide by a zero stride)
        oh, ow = self.out_hw()
        return (min(self.n, self.cin, self.cout, self.h, self.w, oh, ow) >= 1
                and self.cin % self.groups == 0 and self.cout % self.groups == 0)  # fmt: skip

    def input_elements(self) -> int:
        return self.n * self.cin * self.h * self.w

    def output_elements(self) -> int:
        oh, ow = self.out_hw()
        return self.n * self.cout * oh * ow

    def weight_elements(self) -> int:
        return self.cout * (self.cin // self.groups) * self.kernel * self.kernel

    def flops(self) -> int:
        """Forward multiply-adds x 2."""
        return 2 * self.output_elements() * (self.cin // self.groups) * self.kernel**2

    def key(self) -> str:
        return (f"{self.n}x{self.cin}x{self.h}x{self.w}-{self.cout}-k{self.kernel}s{self.stride}"
                f"p{self.padding}d{self.dilation}g{self.groups}b{self.bias}")  # fmt: skip


@dataclass(frozen=True)
class Case:
    shape: ConvShape
    dtype_mode: str
    layout: str
    benchmark: bool
    source: str = ""

    @property
    def case_id(self) -> str:
        return f"{self.shape.key()}|{self.dtype_mode}|{self.layout}|b{int(self.benchmark)}"


def S(n, cin, hw, cout, k, s=1, p=-1, d=1, g=1, b=0) -> ConvShape:  # noqa: N802 (table helper)
    return ConvShape(n, cin, hw, hw, cout, k, s, p, d, g, b)


# realistic layers: resnet50 @224, vgg16, mobilenet_v2 / efficientnet / convnext depthwise,
# resnext groups, deeplab dilation, UNet @256, inception 5x5, batch 1
ANCHORS = [
    S(32, 3, 224, 64, 7, 2), S(32, 64, 56, 64, 1, p=0), S(32, 64, 56, 64, 3),
    S(32, 64, 56, 256, 1, p=0), S(32, 256, 56, 128, 1, p=0), S(32, 128, 56, 128, 3, 2),
    S(32, 256, 56, 512, 1, 2, p=0), S(32, 128, 28, 128, 3), S(32, 256, 14, 256, 3),
    S(32, 1024, 14, 256, 1, p=0), S(32, 512, 7, 512, 3), S(32, 2048, 7, 512, 1, p=0),
    S(16, 3, 224, 64, 3, b=1), S(16, 64, 224, 64, 3, b=1), S(16, 128, 112, 128, 3, b=1),
    S(16, 256, 56, 256, 3, b=1), S(16, 512, 28, 512, 3, b=1), S(16, 512, 14, 512, 3, b=1),
    S(64, 32, 112, 32, 3, g=32), S(64, 96, 112, 96, 3, 2, g=96), S(64, 144, 56, 144, 3, g=144),
    S(64, 192, 28, 192, 3, g=192), S(64, 576, 14, 576, 3, g=576), S(64, 960, 7, 960, 3, g=960),
    S(32, 240, 28, 240, 5, g=240), S(32, 672, 14, 672, 5, 2, g=672),
    S(32, 96, 56, 96, 7, g=96, b=1), S(32, 384, 14, 384, 7, g=384, b=1),
    S(32, 128, 56, 128, 3, g=32), S(32, 256, 28, 256, 3, 2, g=32),
    S(8, 512, 28, 512, 3, d=2), S(8, 256, 56, 256, 3, d=2),
    S(16, 1, 256, 64, 3, b=1), S(16, 64, 256, 64, 3, b=1), S(16, 128, 128, 128, 3, b=1),
    S(16, 512, 32, 1024, 3, b=1), S(32, 48, 35, 64, 5),
    S(1, 64, 56, 64, 3), S(1, 3, 224, 64, 7, 2), S(1, 512, 7, 512, 3),
]  # fmt: skip
VARY_BASE = S(16, 64, 56, 64, 3)
VARIATIONS = {
    "n": (1, 2, 4, 8, 32, 64),
    "cin": (3, 16, 32, 128, 256, 512),
    "cout": (16, 32, 128, 256, 512),
    "hw": (7, 14, 28, 112, 224),
    "kernel": (1, 5, 7),
    "stride": (2,),
    "dilation": (2,),
    "groups": (2, 4, 64),
    "padding": (0,),
    "bias": (1,),
}
RANDOM_AXES = {
    "n": (1, 2, 4, 8, 16, 32, 64),
    "cin": (3, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512),
    "cout": (8, 16, 32, 64, 96, 128, 192, 256, 384, 512),
    "hw": (7, 9, 14, 17, 28, 35, 56, 64, 112, 128, 224),
    "kernel": (1, 3, 3, 3, 5, 7),
    "stride": (1, 1, 1, 2),
}
MAX_TENSOR_BYTES = 2**30  # random shapes: input and output at fp32 each at most 1 GiB
MAX_RANDOM_FLOPS = 2e12  # and at most ~40 ms of fp32 (no TF32) forward on an H100


def variations() -> list[ConvShape]:
    b = VARY_BASE
    out = []
    for axis, values in VARIATIONS.items():
        for v in values:
            if axis == "hw":
                out.append(S(b.n, b.cin, v, b.cout, b.kernel))
            elif axis == "groups":
                cin = cout = b.cin
                out.append(S(b.n, cin, b.h, cout, b.kernel, g=v))
            elif axis == "padding":
                out.append(S(b.n, b.cin, b.h, b.cout, b.kernel, p=v))
            elif axis == "dilation":
                out.append(S(b.n, b.cin, b.h, b.cout, b.kernel, d=v))
            else:
                fields = {"n": b.n, "cin": b.cin, "cout": b.cout, "kernel": b.kernel,
                          "stride": b.stride, "bias": b.bias}  # fmt: skip
                fields[axis] = v
                out.append(S(fields["n"], fields["cin"], b.h, fields["cout"], fields["kernel"],
                             fields["stride"], b=fields["bias"]))  # fmt: skip
    return out


def random_shapes(count: int, seed: int = 0) -> list[ConvShape]:
    rng = random.Random(seed)
    out: list[ConvShape] = []
    tries = 0
    while len(out) < count and tries < 100 * count:
        tries += 1
        pick = {axis: rng.choice(values) for axis, values in RANDOM_AXES.items()}
        dilation = 2 if rng.random() < 0.1 and pick["kernel"] > 1 else 1
        roll = rng.random()
        groups, cout = 1, pick["cout"]
        if roll < 0.15:  # depthwise
            groups = cout = pick["cin"]
        elif roll < 0.2 and pick["cin"] % 32 == 0 and cout % 32 == 0:
            groups = 32
        shape = S(pick["n"], pick["cin"], pick["hw"], cout, pick["kernel"], pick["stride"],
                  d=dilation, g=groups, b=int(rng.random() < 0.3))  # fmt: skip
        if (shape.valid() and 4 * max(shape.input_elements(), shape.output_elements())
                <= MAX_TENSOR_BYTES and shape.flops() <= MAX_RANDOM_FLOPS):  # fmt: skip
            out.append(shape)
    return out


def gpumemnet_shapes(path: Path = GPUMEMNET_SHAPES, limit: int | None = None) -> list[ConvShape]:
    """The committed GPUMemNet CNN conv shapes, in their priority order."""
    out = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            out.append(ConvShape(*(int(row[k]) for k in ("n", "cin", "h", "w", "cout", "kernel",
                                                          "stride", "padding", "dilation",
                                                          "groups", "bias"))))  # fmt: skip
            if limit is not None and len(out) >= limit:
                break
    return out


SHAPES_COLUMNS = ("n", "cin", "h", "w", "cout", "kernel", "stride", "padding", "dilation",
                  "groups", "dtype_mode", "layout")  # fmt: skip
"""What `--shapes FILE` needs of each row: benchmarks/conv_table_coverage.py's `--out` format (the
workspace table's shape and setting columns; its `directions` and `job` columns are read when
present, and an optional `bias` column)."""


@dataclass(frozen=True)
class ShapeRequest:
    """One (shape, dtype mode, layout) of a shapes file and the jobs that listed it."""

    shape: ConvShape
    dtype_mode: str
    layout: str
    jobs: int


class ShapesError(ValueError):
    """A `--shapes` file the probe cannot read: one line naming the file (and the line), printed
    by `main` as `cudnn_probe: error: ...`, exit 2, before any case runs."""


MAX_SHAPE_DIM = 2**31 - 1
"""cuDNN's tensor descriptors take int32 sizes: a larger dimension is no convolution it runs."""


def read_shapes(path: Path) -> list[ShapeRequest]:
    """The distinct cases of a shapes file, the ones most jobs listed first (ties: file order).

    A row's bias is its `bias` column where there is one, else 1 when `backward_bias` is among its
    `directions` (the coverage tool lists only the directions the table answered by neighbours;
    a layer without bias has no backward_bias), else 0. Rows of one shape and setting are merged:
    bias if any row has it, jobs counted once each. ShapesError (one line) for a file that is not
    one: no header, a row that is not a convolution, binary, no rows."""
    modes = {mode for mode, _ in MODES}
    layouts = {layout for _, layout in MODES}
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    line = 1
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in SHAPES_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ShapesError(f"{path}: no column {', '.join(missing)} (the coverage tool's "
                                  f"--out format: {', '.join(SHAPES_COLUMNS)}, directions, job)")  # fmt: skip
            for line, row in enumerate(reader, start=2):
                _add_shape_row(merged, row, path, line, modes, layouts)
    except UnicodeDecodeError:
        raise ShapesError(f"{path}:{line + 1}: not UTF-8 text (a binary file?)") from None
    except csv.Error as exc:
        raise ShapesError(f"{path}:{line + 1}: {exc}") from None
    except OSError as exc:
        raise ShapesError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    if not merged:
        raise ShapesError(f"{path}: no shapes (a header and no rows)")
    out = []
    for key, entry in sorted(merged.items(), key=lambda kv: (-len(kv[1]["jobs"]), kv[1]["first"])):
        n, cin, h, w, cout, kernel, stride, padding, dilation, groups, mode, layout = key
        shape = ConvShape(n, cin, h, w, cout, kernel, stride, padding, dilation, groups,
                          entry["bias"])  # fmt: skip
        out.append(ShapeRequest(shape, mode, layout, len(entry["jobs"])))
    return out


def _shown(text: str) -> str:
    """`text` as the error shows it: at most 20 characters, repr'd if not printable (a NUL)."""
    return text[:20] if text.isprintable() else repr(text[:20])


def _add_shape_row(merged: dict[tuple[Any, ...], dict[str, Any]], row: dict[str, Any], path: Path,
                   line: int, modes: set[str], layouts: set[str]) -> None:  # fmt: skip
    try:
        dims = [int(row[c]) for c in SHAPES_COLUMNS[:10]]
    except (TypeError, ValueError):
        raise ShapesError(f"{path}:{line}: a shape column is not an integer") from None
    if not all(0 <= d <= MAX_SHAPE_DIM for d in dims):
        raise ShapesError(f"{path}:{line}: a shape column is out of range (0 to {MAX_SHAPE_DIM})")
    mode, layout = (row["dtype_mode"] or "").strip(), (row["layout"] or "").strip()
    if mode not in modes or layout not in layouts:
        raise ShapesError(f"{path}:{line}: setting {_shown(mode)}/{_shown(layout)} is not one of "
                          f"{sorted(modes)} x {sorted(layouts)}")  # fmt: skip
    bias_text = (row.get("bias") or "").strip()
    if bias_text:
        if bias_text not in ("0", "1"):
            raise ShapesError(f"{path}:{line}: bias {bias_text[:20]!r} is not 0 or 1")
        bias = int(bias_text)
    else:
        bias = int("backward_bias" in (row.get("directions") or "").split())
    shape = ConvShape(*dims, bias)
    if not shape.valid():
        raise ShapesError(f"{path}:{line}: not a valid convolution: {shape}")
    key = (*dims, mode, layout)
    entry = merged.setdefault(key, {"bias": 0, "jobs": set(), "first": line})
    entry["bias"] = max(entry["bias"], bias)
    entry["jobs"].add((row.get("job") or "").strip() or f"line {line}")


def shapes_plan(path: Path, benchmarks: Iterable[bool]) -> list[Case]:
    """The cases of a shapes file (`read_shapes`' order), in their own dtype mode and layout,
    for every benchmark setting (source `shapes`)."""
    requests = read_shapes(path)
    return [Case(r.shape, r.dtype_mode, r.layout, benchmark, "shapes")
            for benchmark in benchmarks for r in requests]  # fmt: skip


def _dedupe(shapes: Iterable[tuple[str, ConvShape]]) -> list[tuple[str, ConvShape]]:
    seen: set[ConvShape] = set()
    out = []
    for source, shape in shapes:
        if shape.valid() and shape not in seen:
            seen.add(shape)
            out.append((source, shape))
    return out


def build_plan(grid: str, benchmarks: Iterable[bool], *, random_count: int = 400,
               gpumemnet_limit: int | None = None, shapes: Path | None = None) -> list[Case]:  # fmt: skip
    """All cases in priority order: per benchmark setting, the generic shapes (anchors, one-axis
    variations around a base layer, random shapes) in every dtype mode x layout, interleaved (with
    benchmark off) with GPUMemNet CNN shapes in their own setting (fp32 with TF32 on, NCHW), one
    generic shape for every len(MODES) GPUMemNet cases. With `shapes` (a file), that file's
    cases instead of the grid (`shapes_plan`)."""
    if shapes is not None:
        return shapes_plan(shapes, benchmarks)
    if grid == "small":
        generic = _dedupe([("small", s) for s in (ANCHORS[2], ANCHORS[0], ANCHORS[20],
                                                   ANCHORS[30], S(2, 16, 14, 16, 1, b=1))])  # fmt: skip
        memnet = gpumemnet_shapes(limit=8 if gpumemnet_limit is None else gpumemnet_limit)
    elif grid == "full":
        generic = _dedupe([("anchor", s) for s in ANCHORS] + [("vary", s) for s in variations()]
                          + [("random", s) for s in random_shapes(random_count)])  # fmt: skip
        memnet = gpumemnet_shapes(limit=gpumemnet_limit)
    else:
        raise ValueError(f"unknown grid {grid!r}: small or full")
    cases: list[Case] = []
    for benchmark in benchmarks:
        ordered: list[Case] = []
        memnet_cases = iter([] if benchmark else
                            [Case(s, "tf32", "nchw", False, "gpumemnet") for s in memnet])  # fmt: skip
        for source, shape in generic:
            ordered += [Case(shape, d, lay, benchmark, source) for d, lay in MODES]
            ordered += [c for c in (next(memnet_cases, None) for _ in MODES) if c is not None]
        ordered += list(memnet_cases)
        seen: set[str] = set()
        for case in ordered:  # a GPUMemNet shape that is also a generic one runs once
            if case.case_id not in seen:
                seen.add(case.case_id)
                cases.append(case)
    return cases


# ------------------------------------------------------------------------------- attribution


def window_events(snapshot: dict[str, Any], device: int = 0) -> list[dict[str, Any]]:
    """The trace events of one device from a `torch.cuda.memory._snapshot()` dict."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return []
    return [dict(e) for e in traces[device]]


def _free_action(events: list[dict[str, Any]]) -> str:
    actions = {e.get("action") for e in events}
    for action in ("free_requested", "free", "free_completed"):
        if action in actions:
            return action
    return "free_requested"


def label_ops(events: list[dict[str, Any]], spans: list[tuple[str, int, int]]) -> None:
    """Name the aten op of every `alloc` event: spans are (op, first, end) allocation ordinals
    within the window (from the allocator's cumulative counter around each op); an allocation
    no span covers gets "?"."""
    ordinal = 0
    for event in events:
        if event.get("action") != "alloc":
            continue
        event["op"] = next((op for op, lo, hi in spans if lo <= ordinal < hi), "?")
        ordinal += 1


@dataclass
class PhaseStats:
    output_bytes: int = 0
    workspace_bytes: int = 0  # peak concurrent temporaries inside conv ops
    workspace_max_alloc_bytes: int = 0
    n_workspace_allocs: int = 0
    sizes: set[int] = field(default_factory=set)
    ops: set[str] = field(default_factory=set)
    other_temp_bytes: int = 0  # peak concurrent temporaries in other ops


def attribute(events: list[dict[str, Any]], expected: list[tuple[str, int]],
              other: str = "other") -> dict[str, PhaseStats]:  # fmt: skip
    """Split a window's allocations into phases.

    ``expected``: the outputs the window should leave alive, in the order the op makes them, as
    (phase name, bytes). A surviving allocation is matched to the first unmatched expected output
    of its size (else it opens phase ``other``); every allocation freed inside the window is a
    temporary of the phase of the last output allocated before it (the first expected phase
    before any). Temporaries of ops outside CONV_OPS (per the events' "op" labels; unlabelled or
    "?" counts as conv) are counted apart. Every expected phase is in the result."""
    free_action = _free_action(events)
    live: dict[int, int] = {}  # addr -> index of its alloc event
    alloc_of_free: dict[int, int] = {}  # free index -> alloc index
    for index, event in enumerate(events):
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = index
        elif action == free_action and event.get("addr") in live:
            alloc_of_free[index] = live.pop(event["addr"])
    survivors = set(live.values())
    result = {name: PhaseStats() for name, _ in expected}
    unmatched = list(expected)
    phase = expected[0][0] if expected else other
    phase_of: dict[int, str] = {}
    for index, event in enumerate(events):
        if event.get("action") != "alloc":
            continue
        if index in survivors:
            match = next((item for item in unmatched if item[1] == event["size"]), None)
            if match is not None:
                unmatched.remove(match)
                phase = match[0]
            else:
                phase = other
            result.setdefault(phase, PhaseStats()).output_bytes += event["size"]
        else:
            phase_of[index] = phase
    # concurrency per phase and kind, in event order
    current: dict[tuple[str, bool], int] = {}
    for index, event in enumerate(events):
        action = event.get("action")
        if action == "alloc" and index in phase_of:
            alloc_index, sign = index, 1
        elif action == free_action and alloc_of_free.get(index) in phase_of:
            alloc_index, sign = alloc_of_free[index], -1
        else:
            continue
        alloc = events[alloc_index]
        name = phase_of[alloc_index]
        op = alloc.get("op", "?")
        conv = op in CONV_OPS or op == "?"
        stats = result.setdefault(name, PhaseStats())
        key = (name, conv)
        current[key] = current.get(key, 0) + sign * alloc["size"]
        if sign > 0:
            stats.ops.add(op)
            if conv:
                stats.n_workspace_allocs += 1
                stats.sizes.add(alloc["size"])
                stats.workspace_max_alloc_bytes = max(stats.workspace_max_alloc_bytes,
                                                      alloc["size"])  # fmt: skip
                stats.workspace_bytes = max(stats.workspace_bytes, current[key])
            else:
                stats.other_temp_bytes = max(stats.other_temp_bytes, current[key])
    return result


# ----------------------------------------------------------------------------------- recorders


@dataclass
class Window:
    events: list[dict[str, Any]]
    peak_delta_bytes: int = 0
    reserved_delta_bytes: int = 0
    segment_alloc_bytes: int = 0
    seconds: float = 0.0


class CudaRecorder:
    """Allocator-history windows on a CUDA device."""

    def __init__(self, torch: Any, device: int = 0) -> None:
        self.torch = torch
        self.device = device
        self._t0 = 0.0
        self._reserved0 = self._allocated0 = 0
        self.count0 = 0

    def alloc_count(self) -> int:
        stats = self.torch.cuda.memory_stats_as_nested_dict(self.device)
        return int(stats["allocation"]["all"]["allocated"])

    def after_op(self, name: str, out: Any) -> None:
        pass

    def begin(self) -> None:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        self._reserved0 = cuda.memory_reserved(self.device)
        self._allocated0 = cuda.memory_allocated(self.device)
        cuda.reset_peak_memory_stats(self.device)
        try:
            cuda.memory._record_memory_history("all", context=None, stacks="python",
                                               clear_history=True)  # fmt: skip
        except TypeError:  # torch without clear_history: disabling drops the history
            cuda.memory._record_memory_history(None)
            cuda.memory._record_memory_history("all", context=None, stacks="python")
        self.count0 = self.alloc_count()
        self._t0 = time.perf_counter()

    def end(self) -> Window:
        cuda = self.torch.cuda
        cuda.synchronize(self.device)
        seconds = time.perf_counter() - self._t0
        snapshot = cuda.memory._snapshot()
        cuda.memory._record_memory_history(None)
        events = window_events(snapshot, self.device)
        return Window(
            events=events,
            peak_delta_bytes=int(cuda.max_memory_allocated(self.device)) - self._allocated0,
            reserved_delta_bytes=int(cuda.memory_reserved(self.device)) - self._reserved0,
            segment_alloc_bytes=sum(
                e["size"] for e in events if e.get("action") == "segment_alloc"
            ),
            seconds=seconds,
        )

    def abort(self) -> None:
        with contextlib.suppress(Exception):  # cleanup after a failed case
            self.torch.cuda.memory._record_memory_history(None)


class FakeRecorder:
    """CPU stand-in for tests: every tensor an op returns is an allocation that stays, and each
    conv op also takes a workspace of ``workspace(op, output_index, nbytes)`` bytes, allocated
    after that output and freed at once (the order cuDNN calls have)."""

    def __init__(self, workspace: Callable[[str, int, int], int] | None = None) -> None:
        self.workspace = workspace or (lambda op, i, nbytes: nbytes // (2 + i))
        self.events: list[dict[str, Any]] = []
        self.count = 0
        self.count0 = 0
        self._addr = 0x1000
        self._t0 = 0.0

    def _alloc(self, size: int, free: bool) -> None:
        self._addr += 0x100000
        self.events.append({"action": "alloc", "addr": self._addr, "size": size, "stream": 0})
        self.count += 1
        if free:
            self.events.append({"action": "free_requested", "addr": self._addr, "size": size,
                                "stream": 0})  # fmt: skip
            self.events.append({"action": "free_completed", "addr": self._addr, "size": size,
                                "stream": 0})  # fmt: skip

    def alloc_count(self) -> int:
        return self.count

    def after_op(self, name: str, out: Any) -> None:
        import torch

        outputs = out if isinstance(out, (tuple, list)) else [out]
        for i, tensor in enumerate(t for t in outputs if isinstance(t, torch.Tensor)):
            nbytes = tensor.untyped_storage().nbytes()
            self._alloc(nbytes, free=False)
            if name in CONV_OPS:
                ws = self.workspace(name, i, nbytes)
                if ws:
                    self._alloc(ws, free=True)

    def begin(self) -> None:
        self.events = []
        self.count0 = self.count
        self._t0 = time.perf_counter()

    def end(self) -> Window:
        return Window(events=self.events, seconds=time.perf_counter() - self._t0)

    def abort(self) -> None:
        pass


def op_marker(recorder: Any):
    """A TorchDispatchMode that records (op, first, end) allocation ordinals of each aten op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpMarker(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.spans: list[tuple[str, int, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            first = recorder.alloc_count()
            out = func(*args, **(kwargs or {}))
            recorder.after_op(func.overloadpacket.__name__, out)
            end = recorder.alloc_count()
            self.spans.append((func.overloadpacket.__name__, first - recorder.count0,
                               end - recorder.count0))  # fmt: skip
            return out

    return OpMarker()


# ------------------------------------------------------------------------------------- a case


def _versions(torch: Any, device: str) -> dict[str, str]:
    if device != "cuda":
        return {"gpu": "cpu", "torch": torch.__version__, "cuda": "", "cudnn": ""}
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version())}  # fmt: skip


def case_rows(case: Case, call: int, phases: dict[str, PhaseStats], window: Window,
              base: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    for direction, stats in phases.items():
        row = dict(base)
        row.update(
            call=call, direction=direction, status="ok",
            workspace_bytes=stats.workspace_bytes,
            workspace_max_alloc_bytes=stats.workspace_max_alloc_bytes,
            n_workspace_allocs=stats.n_workspace_allocs,
            workspace_sizes=";".join(str(s) for s in sorted(stats.sizes, reverse=True)),
            output_bytes=stats.output_bytes, other_temp_bytes=stats.other_temp_bytes,
            ops=";".join(sorted(stats.ops)),
            window_peak_delta_bytes=window.peak_delta_bytes,
            window_reserved_delta_bytes=window.reserved_delta_bytes,
            window_segment_alloc_bytes=window.segment_alloc_bytes,
            seconds=round(window.seconds, 6),
        )  # fmt: skip
        rows.append(row)
    return rows


def base_row(case: Case, versions: dict[str, str]) -> dict[str, Any]:
    row = blank_row(CONV_SCHEMA)
    shape = case.shape
    size = ELEMENT_BYTES[case.dtype_mode]
    row.update(
        case_id=case.case_id, source=case.source, n=shape.n, cin=shape.cin, h=shape.h, w=shape.w,
        cout=shape.cout, kernel=shape.kernel, stride=shape.stride, padding=shape.padding,
        dilation=shape.dilation, groups=shape.groups, bias=shape.bias,
        dtype_mode=case.dtype_mode, layout=case.layout, benchmark=case.benchmark,
        input_bytes=shape.input_elements() * size, weight_bytes=shape.weight_elements() * size,
        **versions,
    )  # fmt: skip
    return row


def expected_directions(case: Case) -> list[str]:
    return ["forward", "backward_data", "backward_weight"] + (
        ["backward_bias"] if case.shape.bias else []
    )


def run_case(torch: Any, case: Case, recorder: Any, device: str, base: dict[str, Any],
             calls: int) -> list[dict[str, Any]]:  # fmt: skip
    """Forward and backward windows of one case, ``calls`` times; rows per call x phase."""
    import torch.nn.functional as F  # noqa: N812

    shape = case.shape
    torch.backends.cudnn.benchmark = case.benchmark
    torch.backends.cudnn.allow_tf32 = case.dtype_mode != "fp32"
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
             "fp16": torch.float16}[case.dtype_mode]  # fmt: skip
    fmt = torch.channels_last if case.layout == "channels_last" else torch.contiguous_format
    x = torch.randn(shape.n, shape.cin, shape.h, shape.w, device=device, dtype=dtype)
    x = x.to(memory_format=fmt).requires_grad_()
    w = torch.randn(shape.cout, shape.cin // shape.groups, shape.kernel, shape.kernel,
                    device=device, dtype=dtype)  # fmt: skip
    w = w.to(memory_format=fmt).requires_grad_()
    b = (
        torch.randn(shape.cout, device=device, dtype=dtype, requires_grad=True)
        if shape.bias
        else None
    )
    args = ([shape.stride] * 2, [shape.padding] * 2, [shape.dilation] * 2)
    try:
        backend = str(torch._C._select_conv_backend(x, w, b, *args, False, [0, 0], shape.groups))
        base = dict(base, backend=backend.rsplit(".", 1)[-1])
    except Exception:  # noqa: BLE001 - private API: informative only
        pass
    inputs = [t for t in (x, w, b) if t is not None]
    rows: list[dict[str, Any]] = []
    for call in range(1, calls + 1):
        marker = op_marker(recorder)
        recorder.begin()
        with marker:
            y = F.conv2d(x, w, b, shape.stride, shape.padding, shape.dilation, shape.groups)
        window = recorder.end()
        label_ops(window.events, marker.spans)
        phases = attribute(window.events, [("forward", y.untyped_storage().nbytes())],
                           other="forward_other")  # fmt: skip
        rows += case_rows(case, call, phases, window, base)
        dy = torch.randn_like(y)
        marker = op_marker(recorder)
        recorder.begin()
        with marker:
            grads = torch.autograd.grad(y, inputs, dy)
        window = recorder.end()
        label_ops(window.events, marker.spans)
        names = ["backward_data", "backward_weight", "backward_bias"][: len(inputs)]
        expected = [(n, t.untyped_storage().nbytes()) for n, t in zip(names, inputs, strict=True)]
        phases = attribute(window.events, expected, other="backward_other")
        rows += case_rows(case, call, phases, window, base)
        del y, dy, grads
    return rows


def failure_rows(case: Case, base: dict[str, Any], status: str, error: str) -> list[dict]:
    rows = []
    for direction in expected_directions(case):
        row = dict(base, direction=direction, status=status, error=error[:300], call=1)
        rows.append(row)
    return rows


def classify_error(exc: BaseException) -> tuple[str, bool]:
    """(status, whether the CUDA context is poisoned and the process must end)."""
    text = str(exc)
    name = type(exc).__name__
    if "OutOfMemoryError" in name or "out of memory" in text:
        return "oom", False
    fatal = ("illegal memory access", "device-side assert", "unspecified launch failure",
             "CUDNN_STATUS_EXECUTION_FAILED", "CUDA error: an illegal", "misaligned address")  # fmt: skip
    if any(f in text for f in fatal):
        return "error", True
    unsupported = ("NOT_SUPPORTED", "not supported", "No valid", "no valid", "Unable to find",
                   "not implemented", "unsupported")  # fmt: skip
    if any(u in text for u in unsupported):
        return "unsupported", False
    return "error", False


# ------------------------------------------------------------------------------------ budget


class Budget:
    """No case starts that would not end by the deadline: the estimate of the next case is the
    slowest of the last ``window`` cases (times ``margin``)."""

    def __init__(self, deadline: float, clock: Callable[[], float] = time.monotonic,
                 window: int = 20, margin: float = 1.25) -> None:  # fmt: skip
        self.deadline = deadline
        self.clock = clock
        self.window = window
        self.margin = margin
        self.recent: list[float] = []

    def record(self, seconds: float) -> None:
        self.recent = [*self.recent[-(self.window - 1) :], seconds]

    def estimate(self) -> float:
        return max(self.recent, default=0.0) * self.margin

    def can_start(self) -> bool:
        return self.clock() + self.estimate() <= self.deadline

    def left(self) -> float:
        return self.deadline - self.clock()


# ------------------------------------------------------------------------------- table files


class Table:
    """The CSV, appended row by row and flushed after every case; a torn last line (a process
    killed mid-write) is cut off before appending."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if path.exists() and path.stat().st_size:
            data = path.read_bytes()
            header = data.split(b"\n", 1)[0].decode().strip("\r")
            if header != ",".join(CONV_COLUMNS):
                moved = path.with_suffix(f".old{int(time.time())}.csv")
                path.rename(moved)
                print(f"cudnn_probe: {path} had another schema: moved to {moved}", flush=True)
            elif not data.endswith(b"\n"):
                with path.open("r+b") as handle:
                    handle.truncate(data.rfind(b"\n") + 1)
        if not path.exists() or not path.stat().st_size:
            with path.open("w", newline="") as handle:
                csv.writer(handle).writerow(CONV_COLUMNS)

    def done(self) -> set[str]:
        with self.path.open(newline="") as handle:
            return {row["case_id"] for row in csv.DictReader(handle) if row.get("case_id")}

    def append(self, rows: list[dict[str, Any]]) -> None:
        with self.path.open("a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CONV_COLUMNS)
            for row in rows:
                check_row(row, CONV_SCHEMA)
                writer.writerow(row)
            handle.flush()


def write_plan(cases: list[Case], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["case_id", "source", *ConvShape.__dataclass_fields__, "dtype_mode",
                         "layout", "benchmark", "gflops", "input_bytes"])  # fmt: skip
        for case in cases:
            writer.writerow([case.case_id, case.source, *astuple(case.shape), case.dtype_mode,
                             case.layout, int(case.benchmark), round(case.shape.flops() / 1e9, 3),
                             case.shape.input_elements() * ELEMENT_BYTES[case.dtype_mode]])  # fmt: skip


# -------------------------------------------------------------------------------- the loop


def run_cases(torch: Any, cases: list[Case], table: Table, recorder: Any, device: str,
              budget: Budget, marker_path: Path | None = None, label: str = "",
              calls: int | None = None, log_every_s: float = 15.0) -> tuple[int, bool]:  # fmt: skip
    """Measure ``cases`` until done or out of budget. Returns (cases measured, whether the
    CUDA context is poisoned)."""
    versions = _versions(torch, device)
    measured = 0
    last_log = time.monotonic()
    for index, case in enumerate(cases):
        if not budget.can_start():
            print(f"[{label}] budget: stopping with {len(cases) - index} cases left "
                  f"({budget.left():.0f} s left, next estimated {budget.estimate():.1f} s)",
                  flush=True)  # fmt: skip
            return measured, False
        if marker_path is not None:
            marker_path.write_text(case.case_id)
        started = time.monotonic()
        base = base_row(case, versions)
        poisoned = False
        try:
            rows = run_case(torch, case, recorder, device, base,
                            calls if calls is not None else (2 if case.benchmark else 1))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - every failure is a row
            recorder.abort()
            status, poisoned = classify_error(exc)
            rows = failure_rows(case, base, status, f"{type(exc).__name__}: {exc}")
        table.append(rows)
        measured += 1
        if device == "cuda":
            torch.cuda.empty_cache()
        budget.record(time.monotonic() - started)
        if poisoned:
            print(f"[{label}] CUDA context poisoned by {case.case_id}: ending this process",
                  flush=True)  # fmt: skip
            return measured, True
        if time.monotonic() - last_log >= log_every_s or index == len(cases) - 1:
            last_log = time.monotonic()
            ws = max((r["workspace_bytes"] for r in rows), default=0)
            print(f"[{label}] {index + 1}/{len(cases)} cases, {budget.left():.0f} s left; last "
                  f"{case.case_id} {rows[0]['status']} max workspace {ws / 2**20:.1f} MiB",
                  flush=True)  # fmt: skip
    if marker_path is not None and marker_path.exists():
        marker_path.unlink()
    return measured, False


def warm_up(torch: Any, device: str) -> None:
    """Create the cuDNN handles (main and autograd thread) and load the common kernels."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = torch.randn(2, 8, 8, 8, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(8, 8, 3, 3, device=device, dtype=dtype, requires_grad=True)
        y = torch.nn.functional.conv2d(x, w, padding=1)
        torch.autograd.grad(y, [x, w], torch.randn_like(y))
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def child(args: argparse.Namespace) -> int:
    import torch

    benchmark = args.child == "on"
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("cudnn_probe: no CUDA GPU here", file=sys.stderr)
        return 2
    table = Table(args.outdir / TABLE)
    done = table.done()
    cases = [c for c in build_plan(args.grid, [benchmark], random_count=args.random,
                                   gpumemnet_limit=args.gpumemnet, shapes=args.shapes)
             if c.case_id not in done]  # fmt: skip
    if args.max_cases is not None:
        cases = cases[: args.max_cases]
    recorder = CudaRecorder(torch) if device == "cuda" else FakeRecorder()
    warm_up(torch, device)
    budget = Budget(time.monotonic() + (args.deadline - time.time()))
    print(f"[{args.child}] {len(cases)} cases to measure ({len(done)} cases already in the "
          f"table), {budget.left():.0f} s", flush=True)  # fmt: skip
    _, poisoned = run_cases(torch, cases, table, recorder, device, budget,
                            args.outdir / MARKER, label=args.child)  # fmt: skip
    return 3 if poisoned else 0


def record_crash(outdir: Path, table: Table, versions: dict[str, str]) -> None:
    """The case the previous process was on when it died, as a `crashed` row."""
    marker = outdir / MARKER
    if not marker.exists():
        return
    case_id = marker.read_text().strip()
    marker.unlink()
    if not case_id or case_id in table.done():
        return
    row = blank_row(CONV_SCHEMA)
    row.update(case_id=case_id, status="crashed", error="the process died in this case",
               call=1, **versions)  # fmt: skip
    table.append([row])
    print(f"cudnn_probe: {case_id} crashed its process: recorded", flush=True)


def parent(args: argparse.Namespace) -> int:
    settings = [s for s in args.benchmark.split(",") if s]
    if not set(settings) <= {"off", "on"}:
        raise SystemExit("--benchmark takes off, on or off,on")
    plan = build_plan(args.grid, [s == "on" for s in settings], random_count=args.random,
                      gpumemnet_limit=args.gpumemnet, shapes=args.shapes)  # fmt: skip
    args.outdir.mkdir(parents=True, exist_ok=True)
    counts = {s: sum(1 for c in plan if c.benchmark == (s == "on")) for s in settings}
    print(f"plan: {len(plan)} cases ({', '.join(f'{s}: {n}' for s, n in counts.items())}); "
          f"{len({c.shape for c in plan})} shapes", flush=True)  # fmt: skip
    table = Table(args.outdir / TABLE)
    if args.dry_run:
        write_plan(plan, args.outdir / PLAN)
        row = base_row(plan[0], {"gpu": "", "torch": "", "cuda": "", "cudnn": ""})
        check_row(row, CONV_SCHEMA)
        print(f"dry run: wrote {args.outdir / PLAN} and the header of {table.path}")
        return 0
    if args.device == "cpu":  # tests: the same loop in this process, synthetic windows
        import torch

        budget = Budget(time.monotonic() + args.budget_s)
        cases = [c for c in plan if c.case_id not in table.done()][: args.max_cases]
        run_cases(torch, cases, table, FakeRecorder(), "cpu", budget, args.outdir / MARKER,
                  label="cpu")  # fmt: skip
        return 0
    start = time.time()
    end = start + args.budget_s
    meta: dict[str, Any] = {"grid": str(args.shapes) if args.shapes else args.grid,
                            "budget_s": args.budget_s, "plan": counts,
                            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "processes": []}  # fmt: skip
    for position, setting in enumerate(settings):
        deadline = (
            end if position == len(settings) - 1 else start + args.budget_s * (1 - args.on_share)
        )
        for attempt in range(6):
            left = deadline - time.time()
            if left < 10:
                break
            record_crash(args.outdir, table, {"gpu": "", "torch": "", "cuda": "", "cudnn": ""})
            cmd = [sys.executable, __file__, str(args.outdir), "--child", setting, "--grid",
                   args.grid, "--deadline", str(deadline), "--random", str(args.random)]  # fmt: skip
            if args.gpumemnet is not None:
                cmd += ["--gpumemnet", str(args.gpumemnet)]
            if args.shapes is not None:
                cmd += ["--shapes", str(args.shapes)]
            if args.max_cases is not None:
                cmd += ["--max-cases", str(args.max_cases)]
            began = time.time()
            try:
                rc = subprocess.run(cmd, timeout=left + KILL_GRACE_S, check=False).returncode
            except subprocess.TimeoutExpired:
                rc = -9
                marker = args.outdir / MARKER
                if marker.exists():
                    marker.unlink()  # cut by the budget: the case is left for the next call
                print(f"cudnn_probe: [{setting}] killed at its deadline", flush=True)
            meta["processes"].append({"setting": setting, "attempt": attempt, "rc": rc,
                                      "seconds": round(time.time() - began, 1)})  # fmt: skip
            if rc in (0, -9, 2):
                break
            print(f"cudnn_probe: [{setting}] process ended with {rc}: starting a fresh one",
                  flush=True)  # fmt: skip
    record_crash(args.outdir, table, {"gpu": "", "torch": "", "cuda": "", "cudnn": ""})
    done = table.done()
    meta["measured"] = {s: sum(1 for c in plan if c.benchmark == (s == "on") and c.case_id in done)
                        for s in settings}  # fmt: skip
    meta["seconds"] = round(time.time() - start, 1)
    meta["env"] = {k: os.environ.get(k, "") for k in ("CUDA_MODULE_LOADING",
                                                       "PYTORCH_CUDA_ALLOC_CONF",
                                                       "CUDNN_LOGINFO_DBG")}  # fmt: skip
    (args.outdir / "cudnn_grid.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"done: measured {meta['measured']} of {counts} cases in {meta['seconds']} s; "
          f"table {table.path}", flush=True)  # fmt: skip
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--grid", default="full", choices=["small", "full"])
    parser.add_argument("--budget-s", type=float, default=480.0)
    parser.add_argument("--benchmark", default="off,on", help="off, on or off,on")
    parser.add_argument(
        "--on-share",
        type=float,
        default=0.4,
        help="share of the budget kept for cudnn.benchmark on (default 0.4)",
    )
    parser.add_argument("--random", type=int, default=400, help="random shapes in the full grid")
    parser.add_argument("--gpumemnet", type=int, default=None, help="GPUMemNet shapes (all)")
    parser.add_argument("--shapes", type=Path, default=None,
                        help="measure this file's cases instead of the grid (the --out CSV of "
                             "benchmarks/conv_table_coverage.py)")  # fmt: skip
    parser.add_argument("--max-cases", type=int, default=None)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=0.0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.child:
            return child(args)
        return parent(args)
    except ShapesError as exc:  # before any case ran: one line, no traceback
        print(f"cudnn_probe: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
