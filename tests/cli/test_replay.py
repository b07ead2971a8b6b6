"""`peakmem replay` and `peakmem simulate` end to end, through the console entry point."""

import json
import pickle

from click.testing import CliRunner

from peakmem.cli.main import main
from peakmem.trace import Trace

MiB = 1024 * 1024
BASE = 0x7F0000000000


def write_snapshot(path, entries, conf=None):
    snap = {"segments": [], "device_traces": [entries]}
    if conf:
        snap["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": conf}
    path.write_bytes(pickle.dumps(snap))
    return str(path)


def e(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0}


def test_replay_json_reports_simulated_and_recorded_peaks(tmp_path):
    path = write_snapshot(
        tmp_path / "s.pickle",
        [
            e("segment_alloc", BASE, 20 * MiB),
            e("alloc", BASE, 19 * MiB),
            e("segment_alloc", BASE + 20 * MiB, 20 * MiB),
            e("alloc", BASE + 20 * MiB, 3 * MiB // 2),
        ],
    )
    result = CliRunner().invoke(main, ["replay", path, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["peak_reserved_bytes"] == 40 * MiB
    assert out["peak_allocated_bytes"] == 20 * MiB + 3 * MiB // 2
    assert out["recorded_peak_reserved_bytes"] == 40 * MiB
    assert out["difference_bytes"] == 0


def test_replay_uses_recorded_alloc_conf_unless_overridden(tmp_path):
    path = write_snapshot(
        tmp_path / "s.pickle",
        [e("alloc", BASE, 4 * MiB), e("alloc", BASE + 4 * MiB, 18 * MiB)],
        conf="expandable_segments:True",
    )
    out = json.loads(CliRunner().invoke(main, ["replay", path, "--json"]).output)
    assert (
        out["peak_reserved_bytes"] == 40 * MiB and out["alloc_conf"] == "expandable_segments:True"
    )
    out = json.loads(
        CliRunner().invoke(main, ["replay", path, "--json", "--alloc-conf", ""]).output
    )
    assert out["peak_reserved_bytes"] == 38 * MiB


def test_replay_capacity_gives_oom(tmp_path):
    path = write_snapshot(
        tmp_path / "s.pickle", [e("alloc", BASE, 30 * MiB), e("alloc", BASE + 30 * MiB, 12 * MiB)]
    )
    result = CliRunner().invoke(main, ["replay", path, "--capacity", "40MiB"])
    assert result.exit_code == 0
    assert "OUT OF MEMORY at event 1" in result.output


def test_replay_human_output_shows_difference(tmp_path):
    path = write_snapshot(
        tmp_path / "s.pickle", [e("segment_alloc", BASE, 20 * MiB), e("alloc", BASE, 4 * MiB)]
    )
    result = CliRunner().invoke(main, ["replay", path])
    assert "peak reserved (recorded)" in result.output
    assert "exact" in result.output


def test_replay_bad_inputs_are_one_line_errors(tmp_path):
    runner = CliRunner()
    not_pickle = tmp_path / "x.pickle"
    not_pickle.write_text("hello")
    wrong_shape = tmp_path / "y.pickle"
    wrong_shape.write_bytes(pickle.dumps({"a": 1}))
    unknown = tmp_path / "z.pickle"
    write_snapshot(unknown, [e("free_requested", BASE, 512)])
    for path, words in [
        (not_pickle, "not a pickled memory snapshot"),
        (wrong_shape, "device_traces"),
        (unknown, "no earlier 'alloc'"),
        (tmp_path / "missing", "no such file"),
    ]:
        result = runner.invoke(main, ["replay", str(path)])
        assert result.exit_code != 0
        assert words in result.output
        assert "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1
    result = runner.invoke(main, ["replay", str(unknown), "--alloc-conf", "bogus:1"])
    assert result.exit_code != 0


def test_replay_bad_alloc_conf_is_an_error(tmp_path):
    path = write_snapshot(tmp_path / "s.pickle", [e("alloc", BASE, 512)])
    result = CliRunner().invoke(main, ["replay", path, "--alloc-conf", "max_split_size_mb:5"])
    assert result.exit_code != 0 and "max_split_size_mb too small" in result.output


def test_simulate_command_reads_a_trace_file(tmp_path):
    t = Trace()
    a = t.alloc(12 * MiB)
    t.free(a)
    t.alloc(30 * MiB)
    path = tmp_path / "t.jsonl"
    t.dump(path)
    result = CliRunner().invoke(main, ["simulate", str(path), "--json", "--capacity", "40MiB"])
    out = json.loads(result.output)
    assert out["num_alloc_retries"] == 1 and out["peak_reserved_bytes"] == 30 * MiB
    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    result = CliRunner().invoke(main, ["simulate", str(bad)])
    assert result.exit_code != 0 and "not a peakmem trace" in result.output
