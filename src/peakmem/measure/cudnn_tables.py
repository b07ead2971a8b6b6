"""The tables of issue 6 measurements: cuDNN convolution workspaces per shape and setting
(benchmarks/cudnn_probe.py) and the device memory that appears outside PyTorch's allocator on a
kernel family's first use (benchmarks/first_use_probe.py).

The column lists here are the one definition of both CSV schemas: the probes write them in this
order, the loaders check them and give each column its type. Loading needs pandas (the `bench`
extra); the probes themselves need only the standard library and torch.

    from peakmem.measure.cudnn_tables import read_conv_grid, workspace_lookup
    grid = read_conv_grid("benchmarks/groundtruth/h100-80gb-hbm3_cudnn_grid.csv")
    workspace_lookup(grid)  # one row per shape x setting x direction: the steady-state workspace
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

# ------------------------------------------------------------------ conv grid (cudnn_probe.py)

SHAPE_COLUMNS = ["n", "cin", "h", "w", "cout", "kernel", "stride", "padding", "dilation",
                 "groups", "bias"]  # fmt: skip
SETTING_COLUMNS = ["dtype_mode", "layout", "benchmark"]
DTYPE_MODES = ("fp32", "tf32", "bf16", "fp16")  # fp32 = fp32 with cudnn.allow_tf32 off
LAYOUTS = ("nchw", "channels_last")
DIRECTIONS = ("forward", "backward_data", "backward_weight", "backward_bias", "backward_other")
STATUSES = ("ok", "oom", "unsupported", "error", "crashed")

# name -> type ("int", "str", "bool"): the CSV's columns, in order
CONV_SCHEMA: dict[str, str] = {
    "case_id": "str",  # stable id of (shape, setting): resume key
    "source": "str",  # which part of the grid: anchor | vary | random | gpumemnet | small | shapes (--shapes FILE)
    **dict.fromkeys(SHAPE_COLUMNS, "int"),  # bias is 0/1
    "dtype_mode": "str",
    "layout": "str",
    "benchmark": "bool",  # cudnn.benchmark
    "call": "int",  # 1 = first call of this shape in the process (benchmark: the search), 2 = next
    "direction": "str",
    "backend": "str",  # torch._C._select_conv_backend: Cudnn, CudaDepthwise2d, ...
    "status": "str",
    "workspace_bytes": "int",  # peak concurrent bytes of temporaries inside the conv op, phase
    "workspace_max_alloc_bytes": "int",  # the largest one
    "n_workspace_allocs": "int",
    "workspace_sizes": "str",  # distinct requested sizes, largest first, ";"-joined
    "output_bytes": "int",  # the phase's output (y, grad_input, grad_weight, grad_bias)
    "input_bytes": "int",
    "weight_bytes": "int",
    "other_temp_bytes": "int",  # temporaries of the window outside the conv ops (peak)
    "ops": "str",  # aten ops the phase's temporaries were made in
    "window_peak_delta_bytes": "int",  # max_memory_allocated - allocated at window start
    "window_reserved_delta_bytes": "int",  # memory_reserved after - before the window
    "window_segment_alloc_bytes": "int",  # cudaMalloc'd in the window (segment_alloc events)
    "seconds": "float",  # the window's wall time
    "error": "str",
    "gpu": "str",
    "torch": "str",
    "cuda": "str",
    "cudnn": "str",
}
CONV_COLUMNS = list(CONV_SCHEMA)

# ------------------------------------------------------------------ first use (first_use_probe.py)

FIRST_USE_SCHEMA: dict[str, str] = {
    "run": "str",  # sequence (all families in one process, fixed order) | isolated (one family)
    "module_loading": "str",  # CUDA_MODULE_LOADING in that process after torch's CUDA init
    "process": "int",  # index of the process within the probe
    "order": "int",  # position of the stage within its process
    "family": "str",  # context, conv_fp32, relu_fp32, adamw_fused, ...
    "stage": "str",  # init | forward | backward | step
    "call": "int",  # 1 = first use, 2 = the same call again (should add nothing)
    "status": "str",  # ok | unsupported | oom | error
    "outside_before_bytes": "int",  # used - reserved before the call
    "outside_after_bytes": "int",
    "outside_delta_bytes": "int",  # what the call loaded outside the allocator
    "device_used_before_bytes": "int",  # cudaMemGetInfo used (total - free), whole device
    "device_used_after_bytes": "int",
    "reserved_before_bytes": "int",
    "reserved_after_bytes": "int",
    "allocated_after_bytes": "int",
    "peak_allocated_delta_bytes": "int",  # max_memory_allocated during the call - before
    "nvml_process_after_bytes": "int",  # NVML's per-process used memory; -1 when unavailable
    "seconds": "float",
    "error": "str",
    "gpu": "str",
    "driver": "str",
    "torch": "str",
    "cuda": "str",
    "cudnn": "str",
}
FIRST_USE_COLUMNS = list(FIRST_USE_SCHEMA)


class SchemaError(ValueError):
    """A table's header is not the schema this version of peakmem reads."""


def blank_row(schema: dict[str, str]) -> dict[str, Any]:
    """A row with every column present: 0 for numbers, "" for text."""
    return {name: ("" if kind == "str" else 0) for name, kind in schema.items()}


def check_row(row: dict[str, Any], schema: dict[str, str]) -> None:
    """Raise SchemaError unless ``row`` has exactly the schema's columns."""
    missing = [c for c in schema if c not in row]
    extra = [c for c in row if c not in schema]
    if missing or extra:
        raise SchemaError(f"row columns differ from the schema: missing {missing}, extra {extra}")


def _read(path: str | Path, schema: dict[str, str]) -> pd.DataFrame:
    import pandas as pd

    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    if list(frame.columns) != list(schema):
        raise SchemaError(
            f"{path}: columns {list(frame.columns)} are not the schema {list(schema)}"
        )
    for name, kind in schema.items():
        column = frame[name]
        if kind == "int":
            frame[name] = pd.to_numeric(column.replace("", "0")).astype("int64")
        elif kind == "float":
            frame[name] = pd.to_numeric(column.replace("", "nan")).astype("float64")
        elif kind == "bool":
            lowered = column.str.lower()
            bad = ~lowered.isin(["true", "false", "1", "0"])
            if bad.any():
                raise SchemaError(f"{path}: column {name} holds {column[bad].iloc[0]!r}")
            frame[name] = lowered.isin(["true", "1"])
        else:
            frame[name] = column.astype("string")
    return frame


def read_conv_grid(path: str | Path) -> pd.DataFrame:
    """The conv grid table with typed columns (int64, float64, bool, string)."""
    return _read(path, CONV_SCHEMA)


def read_first_use(path: str | Path) -> pd.DataFrame:
    """The first-use table with typed columns."""
    return _read(path, FIRST_USE_SCHEMA)


def workspace_lookup(grid: pd.DataFrame, *, call: int | None = None) -> pd.DataFrame:
    """One row per (shape, setting, direction) measured without error: the workspace a training
    step sees. ``call`` None takes the last call measured (the steady state after a
    cudnn.benchmark search); call 1 includes the search's temporaries."""
    ok = grid[grid["status"] == "ok"]
    keys = [*SHAPE_COLUMNS, *SETTING_COLUMNS, "direction"]
    if call is not None:
        ok = ok[ok["call"] == call]
    else:
        ok = ok.sort_values("call").groupby(keys, sort=False).tail(1)
    columns = [*keys, "backend", "workspace_bytes", "workspace_max_alloc_bytes",
               "n_workspace_allocs", "output_bytes", "input_bytes", "weight_bytes"]  # fmt: skip
    return ok[columns].sort_values(keys).reset_index(drop=True)


def workspace_summary(grid: pd.DataFrame) -> pd.DataFrame:
    """Per setting and direction: cases, how many took a workspace, the median and largest
    workspace, and the median workspace relative to the conv's input bytes."""
    table = workspace_lookup(grid)
    table = table.assign(ratio=table["workspace_bytes"] / table["input_bytes"].clip(lower=1))
    grouped = table.groupby([*SETTING_COLUMNS, "direction"])
    summary = grouped.agg(
        cases=("workspace_bytes", "size"),
        with_workspace=("workspace_bytes", lambda s: int((s > 0).sum())),
        median_bytes=("workspace_bytes", "median"),
        max_bytes=("workspace_bytes", "max"),
        median_ratio_to_input=("ratio", "median"),
    )
    return summary.reset_index()


def first_use_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per run kind, module-loading mode and family: the memory loaded outside the allocator on
    first use (call 1, the family's stages summed within a process; the median over processes
    where several ran it, e.g. the `context` stage of every isolated process), and what the
    second call added (should be 0)."""
    import pandas as pd

    ok = table[table["status"] == "ok"]
    keys = ["run", "module_loading", "family"]
    parts = []
    for call, name in ((1, "first_use_bytes"), (2, "second_call_bytes")):
        per_process = (
            ok[ok["call"] == call]
            .groupby([*keys, "process"], sort=False)["outside_delta_bytes"]
            .sum()
        )
        parts.append(per_process.groupby(level=keys, sort=False).median().rename(name))
    return pd.concat(parts, axis=1).fillna(0).astype("int64").reset_index()
