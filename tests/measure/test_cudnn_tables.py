"""The loaders and summaries of the issue 6 tables, on synthetic tables."""

from __future__ import annotations

import csv

import pytest

from peakmem.measure import cudnn_tables as ct


def write(path, schema, rows):
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(schema))
        writer.writeheader()
        for row in rows:
            full = ct.blank_row(schema)
            full.update(row)
            writer.writerow(full)
    return path


SHAPE = {"n": 8, "cin": 64, "h": 56, "w": 56, "cout": 64, "kernel": 3, "stride": 1,
         "padding": 1, "dilation": 1, "groups": 1, "bias": 0, "input_bytes": 6422528}  # fmt: skip


def grid_rows():
    rows = []
    for benchmark, calls in ((False, {1: 100}), (True, {1: 5000, 2: 300})):
        for call, ws in calls.items():
            for direction, factor in (("forward", 1), ("backward_data", 2)):
                rows.append({**SHAPE, "case_id": f"c{int(benchmark)}", "dtype_mode": "tf32",
                             "layout": "nchw", "benchmark": benchmark, "call": call,
                             "direction": direction, "status": "ok", "backend": "Cudnn",
                             "workspace_bytes": ws * factor, "seconds": 0.5})  # fmt: skip
    rows.append({**SHAPE, "case_id": "bad", "dtype_mode": "bf16", "layout": "nchw",
                 "direction": "forward", "status": "oom", "error": "CUDA out of memory"})  # fmt: skip
    return rows


def test_read_conv_grid_types(tmp_path):
    grid = ct.read_conv_grid(write(tmp_path / "g.csv", ct.CONV_SCHEMA, grid_rows()))
    assert list(grid.columns) == ct.CONV_COLUMNS
    assert grid["workspace_bytes"].dtype == "int64"
    assert grid["benchmark"].dtype == bool and grid["benchmark"].sum() == 4
    assert grid["seconds"].dtype == "float64"
    assert str(grid["direction"].dtype) == "string"


def test_schema_mismatch_is_an_error(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text("case_id,n\nx,1\n")
    with pytest.raises(ct.SchemaError):
        ct.read_conv_grid(path)
    rows = grid_rows()
    rows[0]["benchmark"] = "maybe"
    with pytest.raises(ct.SchemaError):
        ct.read_conv_grid(write(tmp_path / "h.csv", ct.CONV_SCHEMA, rows))
    with pytest.raises(ct.SchemaError):
        ct.check_row({"case_id": "x"}, ct.CONV_SCHEMA)


def test_workspace_lookup_takes_the_steady_state(tmp_path):
    grid = ct.read_conv_grid(write(tmp_path / "g.csv", ct.CONV_SCHEMA, grid_rows()))
    table = ct.workspace_lookup(grid)
    assert len(table) == 4  # 2 settings x 2 directions; the OOM row is left out
    on = table[table["benchmark"]].set_index("direction")["workspace_bytes"]
    assert on.to_dict() == {"backward_data": 600, "forward": 300}
    search = ct.workspace_lookup(grid, call=1)
    assert search[search["benchmark"]]["workspace_bytes"].max() == 10000


def test_workspace_summary(tmp_path):
    grid = ct.read_conv_grid(write(tmp_path / "g.csv", ct.CONV_SCHEMA, grid_rows()))
    summary = ct.workspace_summary(grid)
    row = summary[(~summary["benchmark"]) & (summary["direction"] == "backward_data")].iloc[0]
    assert row["cases"] == 1 and row["with_workspace"] == 1 and row["max_bytes"] == 200
    assert row["median_ratio_to_input"] == pytest.approx(200 / 6422528)


def test_first_use_summary(tmp_path):
    rows = []
    for process, fam in enumerate(["relu_fp32", "conv_tf32"]):
        rows += [
            {"run": "isolated", "module_loading": "LAZY", "process": process, "family": "context",
             "stage": "init", "call": 1, "status": "ok", "outside_delta_bytes": 500 + process},
            {"run": "isolated", "module_loading": "LAZY", "process": process, "family": fam,
             "stage": "forward", "call": 1, "status": "ok", "outside_delta_bytes": 10},
            {"run": "isolated", "module_loading": "LAZY", "process": process, "family": fam,
             "stage": "backward", "call": 1, "status": "ok", "outside_delta_bytes": 20},
            {"run": "isolated", "module_loading": "LAZY", "process": process, "family": fam,
             "stage": "backward", "call": 2, "status": "ok", "outside_delta_bytes": 0},
        ]  # fmt: skip
    rows.append({"run": "isolated", "module_loading": "LAZY", "process": 1, "family": "x",
                 "stage": "forward", "call": 1, "status": "error", "outside_delta_bytes": 99})  # fmt: skip
    table = ct.read_first_use(write(tmp_path / "f.csv", ct.FIRST_USE_SCHEMA, rows))
    summary = ct.first_use_summary(table).set_index("family")
    assert summary.loc["relu_fp32", "first_use_bytes"] == 30
    assert summary.loc["relu_fp32", "second_call_bytes"] == 0
    assert summary.loc["context", "first_use_bytes"] == 500  # median of 500, 501 -> int
    assert "x" not in summary.index
