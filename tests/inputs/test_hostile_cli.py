"""The hostile-input regression gate: every file of the corpus (tests/data/hostile_inputs/ plus
the pickles and large files tests/inputs/hostile_corpus.py generates) and odd flags, through
the real CLI. Each must end with exit 2 (0 where the input is valid), one line on stderr, no
traceback, no marker file from a payload, in bounded time.

Payload pickles and nesting bombs run in a real `python -m peakmem` subprocess (a crash or an
executed payload cannot hide there); the rest runs in-process with click's CliRunner (fast).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from peakmem.cli.main import main
from tests.inputs.hostile_corpus import generate

COMMITTED = Path(__file__).resolve().parents[1] / "data" / "hostile_inputs"
SRC = Path(__file__).resolve().parents[2] / "src"
TIME_LIMIT_S = 30.0

VALID = {
    "valid_protocol0.pickle", "valid_protocol1.pickle", "valid_protocol2.pickle",
    "valid_protocol3.pickle", "valid_protocol4.pickle", "valid_protocol5.pickle",
    "trace_valid.jsonl", "trace_header_only.jsonl", "trace_bom.jsonl",
    "mlp1_valid.csv", "mlp1_bom.csv",
    # the MLP loader never reads Activations-Params (parse_layer_list's own test takes the bomb)
    "mlp1_layer_list_bomb.csv",
}
# Files run in a subprocess: code-execution payloads, torch objects and the nesting bombs.
SUBPROCESS = {
    "os_system_protocol0.pickle", "os_system_protocol2.pickle", "os_system_protocol5.pickle",
    "builtins_eval.pickle", "builtins_exec.pickle", "subprocess_popen.pickle",
    "subprocess_call.pickle", "payload_inside_snapshot.pickle", "opcode_global_reduce.pickle",
    "opcode_inst.pickle", "opcode_stack_global.pickle", "opcode_obj.pickle",
    "torch_tensor.pickle", "deep_tuple_key.pickle", "deep_lists.pickle",
    "valid_protocol4.pickle", "trace_deep_header.jsonl",
}
# What the one line must say, for some files.
SAYS = {
    "os_system_protocol0.pickle": "refused: the pickle asks for posix.system",
    "builtins_eval.pickle": "refused: the pickle asks for builtins.eval",
    "subprocess_popen.pickle": "refused: the pickle asks for subprocess.Popen",
    "torch_tensor.pickle": "refused: the pickle asks for torch._utils._rebuild_tensor_v2",
    "opcode_persid.pickle": "persistent object",
    "torch_save.pt": "zip archive",
    "deep_tuple_key.pickle": "refused: unpickling it crashed the unpickler",
    "deep_lists.pickle": "holds a list, not a dict",
    "truncated.pickle": "truncated",
    "empty.pickle": "empty file",
    "size_nan.pickle": "has no integer 'size'",
    "size_negative.pickle": "(got -512)",
    "action_list.pickle": "has no 'action' string",
    "duplicate_address.pickle": "which entry 1 allocated and no entry freed",
    "free_never_allocated.pickle": "no earlier 'alloc'",
    "settings_async_backend.pickle": "cudaMallocAsync is not simulated",
    "two_devices.pickle": "--device",
    "trace_10mb_line.jsonl": "trace_10mb_line.jsonl:2: line is longer than 4096 bytes",
    "trace_size_nan.jsonl": "trace_size_nan.jsonl:2:",
    "trace_size_float.jsonl": "trace_size_float.jsonl:2: size is 512.5",
    "trace_free_never_allocated.jsonl": "trace_free_never_allocated.jsonl:3: event 1: free of id 7",
    "trace_duplicate_tags.jsonl": ":1: header tag 1 repeats tag 0",
    "trace_non_utf8.jsonl": ":3: not UTF-8",
    "trace_deep_header.jsonl": ":1: not a peakmem trace: the first line is not JSON (nested too",
    "trace_blank_line_inside.jsonl": ":3: blank line inside the events",
    "mlp1_missing_columns.csv": "mlp_data_step1.csv:1: missing columns Max GPU Memory (MiB)",
    "mlp1_memory_text.csv": "mlp_data_step1.csv:3: column 'Max GPU Memory (MiB)' is the string 'abc'",
    "mlp1_memory_nan.csv": ":2: column 'Max GPU Memory (MiB)'",
    "mlp1_huge_field.csv": "field larger than field limit",
    "mlp1_batch_huge.csv": "job batch_size",
    "mlp1_extra_fields.csv": ":2: 10 fields, the header has 8",
    "mlp1_non_utf8.csv": "not UTF-8",
    "xmem_real_oom_garbage.csv": "column 'real_oom' is the string 'maybe'",
    "timm_batch_float.csv": "column 'batch_size' is the string '8.5', expected an integer",
}
BENCH_FILES = {
    "mlp1": ("gpumemnet-mlp1", "gpumemnet/mlp_data_step1.csv"),
    "timm": ("timm", "gpumemnet/timm_measured.csv"),
    "xmem": ("xmem", "xmem/xmem_runs.csv"),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("hostile")
    marker = root / "MARKER"
    generate(root / "files", marker)
    for path in COMMITTED.iterdir():
        if path.is_file() and path.suffix in (".jsonl", ".csv"):
            shutil.copy(path, root / "files" / path.name)
    return root / "files", marker


def corpus_names() -> list[str]:
    from tests.inputs.hostile_corpus import big_files, pickles

    names = set(pickles(Path("/nonexistent")) | big_files())
    names |= {p.name for p in COMMITTED.iterdir() if p.suffix in (".jsonl", ".csv")}
    return sorted(names)


def command_for(name: str, files: Path, tmp_path: Path) -> list[str]:
    path = files / name
    if name.endswith((".pickle", ".pt")):
        return ["replay", str(path)]
    if name.endswith(".jsonl"):
        return ["simulate", str(path)]
    dataset, target = BENCH_FILES[name.split("_")[0]]
    data = tmp_path / "data"
    (data / target).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, data / target)
    return ["bench", dataset, "--data", str(data), "--estimators", "horus", "--no-cache",
            "--jobs", "1"]


def run_cli(args: list[str], in_subprocess: bool, env: dict[str, str] | None = None):
    """(exit code, stdout, stderr, seconds)."""
    start = time.monotonic()
    if in_subprocess:
        environ = {**os.environ, "PYTHONPATH": str(SRC), **(env or {})}
        done = subprocess.run(
            [sys.executable, "-m", "peakmem", *args], capture_output=True, text=True,
            timeout=120, env=environ, cwd=str(SRC.parent),
        )
        return done.returncode, done.stdout, done.stderr, time.monotonic() - start
    result = CliRunner().invoke(main, args, env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr, time.monotonic() - start


def check_failure(rc: int, out: str, err: str, seconds: float, expected_rc: int = 2) -> str:
    assert rc == expected_rc, (rc, out, err)
    assert "Traceback" not in out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("peakmem: error: ")
    assert seconds < TIME_LIMIT_S
    return lines[0]


@pytest.mark.parametrize("name", corpus_names())
def test_corpus_file_through_the_cli(name, corpus, tmp_path):
    files, marker = corpus
    args = command_for(name, files, tmp_path)
    rc, out, err, seconds = run_cli(args, in_subprocess=name in SUBPROCESS)
    assert not marker.exists(), "a payload in the file ran"
    if name in VALID:
        assert rc == 0, (out, err)
        assert "Traceback" not in out + err
        return
    line = check_failure(rc, out, err, seconds)
    if name in SAYS:
        assert SAYS[name] in line
    assert out.strip() == ""


@pytest.mark.parametrize(
    "name",
    ["os_system_protocol4.pickle", "trace_size_nan.jsonl", "deep_tuple_key.pickle",
     "mlp1_memory_text.csv"],
)
def test_json_failures_are_one_error_object(name, corpus, tmp_path):
    files, marker = corpus
    args = [*command_for(name, files, tmp_path), "--json"]
    rc, out, err, seconds = run_cli(args, in_subprocess=name.endswith(".pickle"))
    line = check_failure(rc, out, err, seconds)
    payload = json.loads(out)
    assert set(payload) == {"error"}
    error = payload["error"]
    assert error["kind"] == "bad_input" and error["exit_code"] == 2
    assert error["message"] in line and "\n" not in error["message"]
    assert not marker.exists()


def test_marker_payloads_would_run_under_plain_pickle(corpus):
    """The gate is real: the same payload does write the marker when unpickled naively."""
    files, marker = corpus
    code = (
        "import pickle,sys; pickle.loads(open(sys.argv[1], 'rb').read())"
    )
    subprocess.run([sys.executable, "-c", code, str(files / "os_system_protocol4.pickle")],
                   check=True, timeout=60)
    assert marker.exists()
    marker.unlink()


FLAG_CASES = [
    (["simulate", "{trace}", "--torch", "9.9.9"],
     "no allocator rules for torch 9.9.9; known: 2.4, 2.5, 2.6"),
    (["replay", "{snap}", "--torch", "9.9.9"], "no allocator rules for torch 9.9.9; known:"),
    (["simulate", "{trace}", "--torch", "2.14.0"], "no allocator rules for torch 2.14.0"),
    (["simulate", "{trace}", "--torch", "3.0"], "no allocator rules for torch 3.0"),
    (["simulate", "{trace}", "--torch", "1.13.1"], "no allocator rules for torch 1.13.1"),
    (["simulate", "{trace}", "--torch", "latest"], "not a torch version: 'latest'"),
    (["simulate", "{trace}", "--torch", ""], "not a torch version"),
    (["simulate", "{trace}", "--alloc-conf", "backend:cudaMallocAsync"],
     "allocator backend cudaMallocAsync is not simulated"),
    (["replay", "{snap}", "--alloc-conf", "backend:cudaMallocAsync"], "not simulated"),
    (["simulate", "{trace}", "--alloc-conf", "max_split_size_mb:abc"], "max_split_size_mb"),
    (["simulate", "{trace}", "--alloc-conf", "bogus\nsecond line"],
     "Error parsing CachingAllocator option bogus"),
    (["simulate", "{trace}", "--capacity", "-1"], "--capacity '-1' is not a size"),
    (["simulate", "{trace}", "--capacity", "nan"], "--capacity 'nan' is not a size"),
    (["simulate", "{trace}", "--capacity", "inf"], "is not a size"),
    (["simulate", "{trace}", "--capacity", "12 parsecs"], "is not a size"),
    (["simulate", "{trace}", "--capacity", "1e9"], "is not a size"),
    (["simulate", "{trace}", "--capacity", "99999999999TiB"], "is not a size"),
    (["replay", "{snap}", "--capacity", "-5GiB"], "is not a size"),
    (["replay", "{snap}", "--device", "-1"], "--device"),
    (["replay", "{snap}", "--device", "abc"], "--device"),
    (["replay", "{snap}", "--device", "7"], "has no device 7"),
    (["simulate", "{trace}", "--no-such-flag"], "No such option"),
    (["simulate"], "Missing argument"),
    (["replay", "{dir}"], "is a directory"),
    (["replay", "/dev/zero"], "is a device, not a regular file"),
    (["simulate", "/dev/zero"], "is a device, not a regular file"),
    (["simulate", "{fifo}"], "is a FIFO, not a regular file"),
    (["replay", "{missing}"], "no such file"),
    (["bench", "imagenet"], "unknown dataset 'imagenet'"),
    (["bench", "timm", "--estimators", "oracle"], "unknown estimator oracle"),
    (["bench", "timm", "--data", "{missing}"], "does not exist"),
    (["bench", "timm", "--limit", "0"], "--limit"),
]


@pytest.fixture
def flag_inputs(tmp_path) -> dict[str, str]:
    from tests.inputs.hostile_corpus import pickles

    (tmp_path / "snap.pickle").write_bytes(pickles(tmp_path / "M")["valid_protocol4.pickle"])
    shutil.copy(COMMITTED / "trace_valid.jsonl", tmp_path / "trace.jsonl")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"trace": str(tmp_path / "trace.jsonl"), "snap": str(tmp_path / "snap.pickle"),
            "dir": str(tmp_path), "fifo": str(fifo), "missing": str(tmp_path / "missing")}


@pytest.mark.parametrize("args, says", FLAG_CASES, ids=[" ".join(a) for a, _ in FLAG_CASES])
def test_odd_flags_are_one_line_errors(args, says, flag_inputs):
    argv = [a.format(**flag_inputs) for a in args]
    rc, out, err, seconds = run_cli(argv, in_subprocess=False)
    line = check_failure(rc, out, err, seconds)
    assert says in line


@pytest.mark.parametrize("version, rules", [("2.6.3", "2.6.3"), ("2.13.0+cpu", "2.13.0+cpu"),
                                             ("2.4", "2.4"), ("2.10.0rc1", "2.10.0rc1")])
def test_known_minor_versions_are_accepted(version, rules, flag_inputs):
    rc, out, err, _ = run_cli(
        ["simulate", flag_inputs["trace"], "--torch", version, "--json"], in_subprocess=False
    )
    assert rc == 0, err
    assert json.loads(out)["torch_version"] == rules


def test_input_cap_from_the_environment(flag_inputs):
    rc, out, err, seconds = run_cli(
        ["simulate", flag_inputs["trace"]], in_subprocess=False,
        env={"PEAKMEM_MAX_INPUT_BYTES": "64"},
    )
    assert "over the 64-byte cap on input files" in check_failure(rc, out, err, seconds)
    rc, out, err, seconds = run_cli(
        ["replay", flag_inputs["snap"]], in_subprocess=False,
        env={"PEAKMEM_MAX_INPUT_BYTES": "abc"},
    )
    assert "PEAKMEM_MAX_INPUT_BYTES='abc' is not a size" in check_failure(rc, out, err, seconds)


def test_an_internal_error_is_exit_70_with_one_json_object(flag_inputs, monkeypatch):
    import peakmem.cli.simulate as command

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(command, "simulate", broken)
    result = CliRunner().invoke(main, ["simulate", flag_inputs["trace"], "--json"])
    assert result.exit_code == 70
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("peakmem internal error: KeyError: 'boom'")
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "internal" and error["exit_code"] == 70
    assert "Traceback" in error["traceback"]
