"""benchmarks/cudnn_probe.py without a GPU: the plan, the attribution of a window's allocations
to conv phases (on snapshot dicts shaped like torch.cuda.memory._snapshot()), the budget, the
table file, and the whole loop on the CPU with a synthetic recorder."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import cudnn_probe as cp  # noqa: E402

from peakmem.measure.cudnn_tables import CONV_COLUMNS, read_conv_grid  # noqa: E402

MiB = 2**20


def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0}


def free(addr, size):
    return [ev("free_requested", addr, size), ev("free_completed", addr, size)]


def snapshot(events):
    return {"segments": [{"address": 0x1000, "total_size": 64 * MiB, "blocks": []}],
            "device_traces": [events]}  # fmt: skip


# ------------------------------------------------------------------------------------ plan


@pytest.fixture(autouse=True)
def cudnn_flags_kept():
    """The probe's loop sets cudnn.benchmark / allow_tf32 per case in this process: put them back,
    or a later capture in the same pytest worker runs with benchmark on (search workspaces)."""
    import torch

    cudnn = torch.backends.cudnn
    saved = (cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32)
    yield
    cudnn.benchmark, cudnn.deterministic, cudnn.allow_tf32 = saved


def test_full_plan_holds_every_setting_and_the_gpumemnet_shapes():
    plan = cp.build_plan("full", [False, True])
    ids = [c.case_id for c in plan]
    assert len(ids) == len(set(ids))
    memnet = cp.gpumemnet_shapes()
    assert len(memnet) >= 1000
    off = {c.shape for c in plan if not c.benchmark and c.dtype_mode == "tf32"
           and c.layout == "nchw"}  # fmt: skip
    assert set(memnet) <= off  # every committed GPUMemNet shape, in the default setting
    kernels = {c.shape.kernel for c in plan}
    assert {1, 3, 5, 7} <= kernels
    assert {1, 2} <= {c.shape.stride for c in plan}
    assert 2 in {c.shape.dilation for c in plan}
    assert any(c.shape.groups == c.shape.cin > 1 for c in plan)  # depthwise
    assert {c.dtype_mode for c in plan} == {"fp32", "tf32", "bf16", "fp16"}
    assert {c.layout for c in plan} == {"nchw", "channels_last"}
    batches = {c.shape.n for c in plan}
    assert min(batches) == 1 and max(batches) >= 62
    for case in plan:
        assert case.shape.valid(), case
    # the first cases are the anchors in every mode, then GPUMemNet shapes interleave
    assert plan[0].source == "anchor" and plan[len(cp.MODES)].source == "gpumemnet"


def test_gpumemnet_shapes_file_matches_the_models():
    # the largest conv of the first GPUMemNet row in the file is reproduced by the builder
    shapes = cp.gpumemnet_shapes(limit=5)
    assert all(s.kernel in (1, 3) and s.bias == 1 for s in shapes)
    assert all(s.padding == s.kernel // 2 for s in shapes)


def test_small_plan_and_dry_run(tmp_path):
    assert cp.main([str(tmp_path), "--grid", "small", "--dry-run"]) == 0
    with (tmp_path / cp.TABLE).open() as handle:
        assert handle.read().strip() == ",".join(CONV_COLUMNS)
    with (tmp_path / cp.PLAN).open() as handle:
        plan_rows = list(csv.DictReader(handle))
    assert len(plan_rows) == len(cp.build_plan("small", [False, True]))
    assert read_conv_grid(tmp_path / cp.TABLE).empty


def test_benchmark_settings_never_share_a_case_id():
    plan = cp.build_plan("small", [False, True])
    off = {c.case_id for c in plan if not c.benchmark}
    on = {c.case_id for c in plan if c.benchmark}
    assert off and on and not off & on


def test_shape_geometry():
    s = cp.S(2, 8, 9, 4, 3, 2, d=2)
    assert s.padding == 2 and s.out_hw() == (5, 5)
    assert not cp.S(1, 8, 2, 8, 7, p=0).valid()
    assert not cp.S(1, 6, 8, 8, 3, g=4).valid()


# ----------------------------------------------------------------------------- attribution


FORWARD = [  # output, then two overlapping workspaces and a third later
    ev("segment_alloc", 0x1000, 64 * MiB),
    ev("alloc", 0x1000, 10 * MiB),
    ev("alloc", 0xB00000, 30 * MiB), ev("alloc", 0x3000000, 5 * MiB),
    *free(0x3000000, 5 * MiB), *free(0xB00000, 30 * MiB),
    ev("alloc", 0xB00000, 2 * MiB), *free(0xB00000, 2 * MiB),
]  # fmt: skip


def test_forward_workspace_from_a_snapshot():
    events = cp.window_events(snapshot(FORWARD))
    phases = cp.attribute(events, [("forward", 10 * MiB)])
    fwd = phases["forward"]
    assert fwd.output_bytes == 10 * MiB
    assert fwd.workspace_bytes == 35 * MiB  # peak concurrent
    assert fwd.workspace_max_alloc_bytes == 30 * MiB
    assert fwd.n_workspace_allocs == 3
    assert fwd.sizes == {30 * MiB, 5 * MiB, 2 * MiB}


BACKWARD = [  # grad_input, its workspace; grad_weight, its workspace; grad_bias, a reduction buffer
    ev("alloc", 0x100, 8 * MiB), ev("alloc", 0x200, 20 * MiB), *free(0x200, 20 * MiB),
    ev("alloc", 0x300, 1 * MiB), ev("alloc", 0x200, 12 * MiB), ev("alloc", 0x400, 3 * MiB),
    *free(0x400, 3 * MiB), *free(0x200, 12 * MiB),
    ev("alloc", 0x500, 512), ev("alloc", 0x600, 4096), *free(0x600, 4096),
]  # fmt: skip


def test_backward_phases_by_output_order():
    phases = cp.attribute(cp.window_events(snapshot(BACKWARD)),
                          [("backward_data", 8 * MiB), ("backward_weight", 1 * MiB),
                           ("backward_bias", 512)], other="backward_other")  # fmt: skip
    assert phases["backward_data"].workspace_bytes == 20 * MiB
    assert phases["backward_weight"].workspace_bytes == 15 * MiB
    assert phases["backward_weight"].workspace_max_alloc_bytes == 12 * MiB
    assert phases["backward_bias"].workspace_bytes == 4096
    assert [phases[p].output_bytes for p in ("backward_data", "backward_weight",
                                              "backward_bias")] == [8 * MiB, MiB, 512]  # fmt: skip
    assert "backward_other" not in phases


def test_equal_sized_grads_follow_the_order():
    events = [ev("alloc", 1, 100), ev("alloc", 2, 7), *free(2, 7),
              ev("alloc", 3, 100), ev("alloc", 4, 9), *free(4, 9)]  # fmt: skip
    phases = cp.attribute(events, [("backward_data", 100), ("backward_weight", 100)])
    assert phases["backward_data"].workspace_bytes == 7
    assert phases["backward_weight"].workspace_bytes == 9


def test_unexpected_survivor_opens_other_phase():
    events = [ev("alloc", 1, 100), ev("alloc", 2, 55), ev("alloc", 3, 9), *free(3, 9)]
    phases = cp.attribute(events, [("forward", 100)], other="forward_other")
    assert phases["forward"].workspace_bytes == 0
    assert phases["forward_other"].output_bytes == 55
    assert phases["forward_other"].workspace_bytes == 9


def test_temporaries_of_other_ops_are_kept_apart():
    events = [ev("alloc", 1, 100), ev("alloc", 2, 40), *free(2, 40),
              ev("alloc", 3, 6), *free(3, 6)]  # fmt: skip
    cp.label_ops(events, [("convolution", 0, 2), ("add", 2, 3)])
    assert [e.get("op") for e in events if e["action"] == "alloc"] == [
        "convolution",
        "convolution",
        "add",
    ]
    phases = cp.attribute(events, [("forward", 100)])
    assert phases["forward"].workspace_bytes == 40
    assert phases["forward"].other_temp_bytes == 6
    assert phases["forward"].ops == {"convolution", "add"}


def test_old_free_action_and_no_events():
    events = [ev("alloc", 1, 10), ev("alloc", 2, 4), ev("free", 2, 4)]
    assert cp.attribute(events, [("forward", 10)])["forward"].workspace_bytes == 4
    assert cp.attribute([], [("forward", 10)])["forward"].output_bytes == 0
    assert cp.window_events({"device_traces": []}) == []


# ---------------------------------------------------------------------------------- budget


def test_budget_stops_before_a_case_that_would_not_fit():
    now = [0.0]
    budget = cp.Budget(deadline=10.0, clock=lambda: now[0], margin=1.0)
    assert budget.can_start()
    budget.record(3.0)
    now[0] = 6.0
    assert budget.can_start()  # 6 + 3 <= 10
    now[0] = 7.5
    assert not budget.can_start()
    budget.record(0.1)  # the estimate is the slowest recent case, not the last
    assert not budget.can_start()


def test_run_cases_stops_at_the_budget(tmp_path):
    import torch

    table = cp.Table(tmp_path / cp.TABLE)
    cases = [cp.Case(cp.S(1, 2, 4, 2, 1), "fp32", "nchw", False, "t"),
             cp.Case(cp.S(1, 2, 5, 2, 1), "fp32", "nchw", False, "t")]  # fmt: skip
    now = [0.0]

    class Clock:
        def __call__(self):
            now[0] += 4.0  # every reading moves the clock: a case "takes" time
            return now[0]

    budget = cp.Budget(deadline=6.0, clock=Clock(), margin=1.0)
    budget.record(5.0)
    measured, poisoned = cp.run_cases(torch, cases, table, cp.FakeRecorder(), "cpu", budget)
    assert (measured, poisoned) == (0, False)
    assert table.done() == set()


# ------------------------------------------------------------------------- the loop on CPU


def tiny_cases():
    return [
        cp.Case(cp.S(2, 4, 6, 8, 3, b=1), "fp32", "nchw", False, "t"),
        cp.Case(cp.S(2, 4, 6, 4, 3, g=4), "tf32", "channels_last", False, "t"),
        cp.Case(cp.S(1, 4, 6, 6, 1, 2), "bf16", "nchw", True, "t"),
    ]


def test_loop_on_cpu_writes_typed_rows_and_resumes(tmp_path):
    import torch

    table = cp.Table(tmp_path / cp.TABLE)
    cases = tiny_cases()
    budget = cp.Budget(deadline=float("inf"))
    measured, _ = cp.run_cases(torch, cases, table, cp.FakeRecorder(), "cpu", budget,
                               tmp_path / cp.MARKER)  # fmt: skip
    assert measured == 3 and not (tmp_path / cp.MARKER).exists()
    grid = read_conv_grid(table.path)
    first = grid[grid["case_id"] == cases[0].case_id]
    assert list(first["direction"]) == ["forward", "backward_data", "backward_weight",
                                        "backward_bias"]  # fmt: skip
    fwd = first.iloc[0]
    out_bytes = 2 * 8 * 6 * 6 * 4
    assert fwd["output_bytes"] == out_bytes
    assert fwd["workspace_bytes"] == out_bytes // 2  # FakeRecorder: nbytes // (2 + index)
    assert fwd["ops"] == "convolution" and fwd["status"] == "ok"
    data = first.iloc[1]
    assert data["output_bytes"] == fwd["input_bytes"] == 2 * 4 * 6 * 6 * 4
    assert data["workspace_bytes"] == data["output_bytes"] // 2
    weight = first.iloc[2]
    assert weight["output_bytes"] == weight["weight_bytes"] == 8 * 4 * 3 * 3 * 4
    assert weight["workspace_bytes"] == weight["output_bytes"] // 3
    assert first.iloc[3]["output_bytes"] == 8 * 4
    # benchmark on: two calls
    on = grid[grid["case_id"] == cases[2].case_id]
    assert sorted(set(on["call"])) == [1, 2]
    assert grid["benchmark"].dtype == bool and grid["n"].dtype == "int64"
    # a second table on the same file resumes: nothing left to do
    again = cp.Table(table.path)
    assert again.done() == {c.case_id for c in cases}


def test_failures_become_rows(tmp_path, monkeypatch):
    import torch

    def boom(*args, **kwargs):
        raise RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")

    monkeypatch.setattr(cp, "run_case", boom)
    table = cp.Table(tmp_path / cp.TABLE)
    cp.run_cases(torch, tiny_cases()[:1], table, cp.FakeRecorder(), "cpu",
                 cp.Budget(float("inf")))  # fmt: skip
    grid = read_conv_grid(table.path)
    assert set(grid["status"]) == {"unsupported"}
    assert "NOT_SUPPORTED" in grid["error"].iloc[0]

    def fatal(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(cp, "run_case", fatal)
    measured, poisoned = cp.run_cases(torch, tiny_cases()[1:], table, cp.FakeRecorder(), "cpu",
                                      cp.Budget(float("inf")))  # fmt: skip
    assert (measured, poisoned) == (1, True)


@pytest.mark.parametrize(
    ("text", "status", "fatal"),
    [("CUDA out of memory. Tried to allocate", "oom", False),
     ("CUDA error: an illegal memory access was encountered", "error", True),
     ("GET was unable to find an engine to execute this computation", "error", False),
     ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED", "unsupported", False)],
)  # fmt: skip
def test_classify_error(text, status, fatal):
    assert cp.classify_error(RuntimeError(text)) == (status, fatal)


def test_torn_last_line_is_cut(tmp_path):
    path = tmp_path / cp.TABLE
    cp.Table(path)
    with path.open("a") as handle:
        handle.write("partial,row")
    table = cp.Table(path)
    assert path.read_text().strip() == ",".join(CONV_COLUMNS)
    assert table.done() == set()


def test_table_with_another_schema_is_moved_aside(tmp_path):
    path = tmp_path / cp.TABLE
    path.write_text("a,b\n1,2\n")
    cp.Table(path)
    assert path.read_text().strip() == ",".join(CONV_COLUMNS)
    assert len(list(tmp_path.glob("cudnn_grid.old*.csv"))) == 1


def test_crash_marker_becomes_a_row(tmp_path):
    table = cp.Table(tmp_path / cp.TABLE)
    (tmp_path / cp.MARKER).write_text("x|fp32|nchw|b0")
    cp.record_crash(tmp_path, table, {"gpu": "g", "torch": "", "cuda": "", "cudnn": ""})
    grid = read_conv_grid(table.path)
    assert list(grid["status"]) == ["crashed"] and not (tmp_path / cp.MARKER).exists()


# --------------------------------------------------------------------------- --shapes FILE

COVERAGE_HEADER = "n,cin,h,w,cout,kernel,stride,padding,dilation,groups,dtype_mode,layout,directions,job"


def write_shapes(path, lines):
    path.write_text("\n".join([COVERAGE_HEADER, *lines]) + "\n")
    return path


def test_shapes_file_from_the_coverage_tool_becomes_cases(tmp_path):
    # two jobs list the ResNet stem (bf16), one the 1x1 head with a bias; the stem comes first
    shapes = write_shapes(tmp_path / "missing.csv", [
        "4,320,7,7,1280,1,1,0,1,1,bf16,nchw,backward_bias backward_weight,python a.py",
        "2,3,32,32,8,7,2,3,1,1,bf16,channels_last,backward_weight forward,python a.py",
        "2,3,32,32,8,7,2,3,1,1,bf16,channels_last,backward_data,python b.py",
        "2,3,32,32,8,7,2,3,1,1,bf16,channels_last,forward,python b.py",  # same job again
    ])  # fmt: skip
    requests = cp.read_shapes(shapes)
    assert [(r.shape.kernel, r.dtype_mode, r.layout, r.jobs) for r in requests] == [
        (7, "bf16", "channels_last", 2), (1, "bf16", "nchw", 1)]
    stem, head = requests[0].shape, requests[1].shape
    assert (stem.n, stem.cin, stem.h, stem.w, stem.cout, stem.stride, stem.padding) == (
        2, 3, 32, 32, 8, 2, 3)
    assert stem.bias == 0 and head.bias == 1  # backward_bias listed: the layer has a bias
    assert head.padding == 0  # the file's padding, not the probe's "same" default
    plan = cp.build_plan("full", [False, True], shapes=shapes)
    assert [(c.shape, c.dtype_mode, c.benchmark, c.source) for c in plan] == [
        (stem, "bf16", False, "shapes"), (head, "bf16", False, "shapes"),
        (stem, "bf16", True, "shapes"), (head, "bf16", True, "shapes")]
    assert plan[0].case_id == "2x3x32x32-8-k7s2p3d1g1b0|bf16|channels_last|b0"
    assert len({c.case_id for c in plan}) == 4


def test_shapes_file_with_a_bias_column_and_bad_rows(tmp_path):
    with_bias = tmp_path / "b.csv"
    with_bias.write_text("n,cin,h,w,cout,kernel,stride,padding,dilation,groups,bias,dtype_mode,"
                         "layout\n2,4,8,8,4,3,1,1,1,1,1,fp16,nchw\n")  # fmt: skip
    (request,) = cp.read_shapes(with_bias)
    assert request.shape.bias == 1 and request.jobs == 1
    with pytest.raises(ValueError, match="no column layout"):
        (tmp_path / "c.csv").write_text("n,cin,h,w,cout,kernel,stride,padding,dilation,groups,"
                                        "dtype_mode\n")  # fmt: skip
        cp.read_shapes(tmp_path / "c.csv")
    with pytest.raises(ValueError, match=r"d.csv:2: setting fp8/nchw"):
        cp.read_shapes(write_shapes(tmp_path / "d.csv", ["2,4,8,8,4,3,1,1,1,1,fp8,nchw,forward,j"]))
    with pytest.raises(ValueError, match="not a valid convolution"):  # groups do not divide cin
        cp.read_shapes(write_shapes(tmp_path / "e.csv", ["2,6,8,8,8,3,1,1,1,4,tf32,nchw,forward,j"]))


def test_shapes_run_on_cpu_and_resume(tmp_path):
    shapes = write_shapes(tmp_path / "missing.csv", [
        "2,4,6,6,8,3,1,1,1,1,tf32,nchw,backward_bias forward,python a.py",
        "2,4,6,6,8,1,1,0,1,1,bf16,channels_last,backward_weight,python a.py",
    ])  # fmt: skip
    out = tmp_path / "out"
    args = [str(out), "--shapes", str(shapes), "--device", "cpu", "--budget-s", "60"]
    assert cp.main([*args, "--benchmark", "off", "--max-cases", "1"]) == 0
    grid = read_conv_grid(out / cp.TABLE)
    assert set(grid["case_id"]) == {"2x4x6x6-8-k3s1p1d1g1b1|tf32|nchw|b0"}
    assert list(grid["direction"]) == ["forward", "backward_data", "backward_weight",
                                       "backward_bias"]  # fmt: skip
    assert set(grid["source"]) == {"shapes"} and set(grid["status"]) == {"ok"}
    assert cp.main([*args, "--benchmark", "off,on"]) == 0  # resumes: the first case is not rerun
    grid = read_conv_grid(out / cp.TABLE)
    per_case = grid.groupby("case_id").size().to_dict()
    assert per_case == {"2x4x6x6-8-k3s1p1d1g1b1|tf32|nchw|b0": 4,
                        "2x4x6x6-8-k1s1p0d1g1b0|bf16|channels_last|b0": 3,
                        "2x4x6x6-8-k3s1p1d1g1b1|tf32|nchw|b1": 8,  # benchmark on: two calls
                        "2x4x6x6-8-k1s1p0d1g1b0|bf16|channels_last|b1": 6}  # fmt: skip
    assert cp.main([*args, "--dry-run"]) == 0
    with (out / cp.PLAN).open() as handle:
        assert [r["source"] for r in csv.DictReader(handle)] == ["shapes"] * 4


HEADER = "n,cin,h,w,cout,kernel,stride,padding,dilation,groups,dtype_mode,layout"
GOOD_ROW = "2,4,8,8,4,3,1,1,1,1,tf32,nchw"


@pytest.mark.parametrize("body, words", [
    (b"", "no column n, cin"),
    (HEADER.encode() + b"\n", "no shapes (a header and no rows)"),
    (bytes(range(128, 256)) * 20, ":2: not UTF-8 text"),
    (f"{HEADER},bias\n{GOOD_ROW},x\n".encode(), ":2: bias 'x' is not 0 or 1"),
    (f"{HEADER},job\n{GOOD_ROW},{'j' * 200_000}\n".encode(), ":2: field larger than field limit"),
    (f"{HEADER}\n{GOOD_ROW}\n99999999999,4,8,8,4,3,1,1,1,1,tf32,nchw\n".encode(),
     ":3: a shape column is out of range"),
    (f"{HEADER}\n2,4,8,8,4,3,0,1,1,1,tf32,nchw\n".encode(), ":2: not a valid convolution"),  # stride 0
    (f"{HEADER}\n2,4,8,8,4,3,1,1,1,0,tf32,nchw\n".encode(), ":2: not a valid convolution"),  # groups 0
    (f"{HEADER}\n2,4,8,8,4,0,1,1,1,1,tf32,nchw\n".encode(), ":2: not a valid convolution"),  # kernel 0
    (f"{HEADER}\n2,4,8,8,4,3,1,1,1,1,tf32\n".encode(), ":2: setting tf32/ is not one of"),
    (f"{HEADER}\n{GOOD_ROW}\x00\n".encode(), r":2: setting tf32/'nchw\x00' is not one of"),
])
def test_a_malformed_shapes_file_is_one_error_line_before_any_case(tmp_path, capsys, body, words):
    """n8's read_shapes named the line for a bad setting or a non-integer column, but the probe
    printed it as a 20-line traceback; a bias that is not 0/1, a binary file, a huge field had
    no line number (ValueError / UnicodeDecodeError / _csv.Error tracebacks); a header with no
    rows ended in IndexError (--dry-run); stride 0 / groups 0 divided by zero; a kernel of 0 or
    a 10**11 batch was planned as a case."""
    path = tmp_path / "shapes.csv"
    path.write_bytes(body)
    assert cp.main(["--shapes", str(path), "--dry-run", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"cudnn_probe: error: {path}"), err
    assert words in err, err
    assert not (tmp_path / "out").exists()  # refused before the plan was written
