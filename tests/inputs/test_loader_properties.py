"""Property tests of every loader of untrusted input: whatever the input, the loader returns a
checked result or raises its own error type (one line), never anything else; valid data round
trips exactly."""

from __future__ import annotations

import io
import math
import os
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peakmem.allocator.config import AllocatorConfig, AllocatorConfigError
from peakmem.allocator.rules import KNOWN_VERSIONS, UnknownTorchVersion, parse_version
from peakmem.allocator.simulate import TraceError, simulate
from peakmem.cli.common import parse_bytes
from peakmem.cli.contract import BadInput
from peakmem.datasets.gpumemnet_jobs import JobParseError, parse_layer_list
from peakmem.datasets.loaders import (
    DatasetFormatError,
    DatasetUnavailable,
    load_groundtruth,
    load_rows,
)
from peakmem.inputs import InputError
from peakmem.trace.events import EventKind, Tag, Trace, TraceFormatError
from peakmem.trace.safe_pickle import RefusedPickle, loads_plain
from peakmem.trace.snapshot import SnapshotError, snapshot_to_trace

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

HEADER = '{"format": "peakmem-trace", "version": 1, "meta": {}, "tags": [["a", null, null, null]]}'

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6),
                            st.dictionaries(st.text(max_size=6), inner, max_size=6)),
    max_leaves=25,
)
plain_values = st.recursive(
    st.one_of(json_scalars, st.binary(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), inner, max_size=5),
    ),
    max_leaves=25,
)


def one_line(exc: BaseException) -> None:
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text


# -- peakmem traces (JSON lines) --------------------------------------------------------------


@FAST
@given(st.binary(max_size=600))
def test_trace_load_of_arbitrary_bytes(data):
    try:
        Trace.load(io.BytesIO(data))
    except TraceFormatError as exc:
        one_line(exc)


@FAST
@given(st.lists(json_values, max_size=6), st.booleans())
def test_trace_load_of_arbitrary_json_events(rows, with_header):
    import json

    lines = [HEADER] if with_header else []
    lines += [json.dumps(row) for row in rows]
    try:
        trace = Trace.load(io.StringIO("\n".join(lines) + "\n"))
    except TraceFormatError as exc:
        one_line(exc)
        return
    try:
        simulate(trace)
    except TraceError as exc:
        one_line(exc)


event_rows = st.lists(
    st.tuples(st.integers(0, 7), st.integers(-(2**63), 2**63 - 1),
              st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1),
              st.integers(-3, 3)),
    max_size=8,
)


@FAST
@given(event_rows)
def test_trace_load_of_integer_events_checks_ranges(rows):
    text = HEADER + "\n" + "\n".join(f"[{k},{i},{s},{st_},{t}]" for k, i, s, st_, t in rows)
    try:
        trace = Trace.load(io.StringIO(text + "\n"))
    except TraceFormatError as exc:
        one_line(exc)
        return
    for kind, ident, size, _, tag in trace.events():
        assert kind in {int(k) for k in EventKind}
        assert tag == -1 or 0 <= tag < len(trace.tags)
        if kind in (EventKind.ALLOC, EventKind.ALLOC_OR_SMALLER):
            assert 0 <= size < 2**63 and ident >= 0
        else:
            assert size == 0


tags = st.one_of(st.none(), st.builds(
    Tag, *(st.one_of(st.none(), st.text(max_size=10)) for _ in range(4))
))


@FAST
@given(st.lists(st.tuples(st.sampled_from(["alloc", "small", "free", "stream", "done", "sync",
                                           "empty", "mark"]),
                          st.integers(0, 2**40), st.integers(0, 5), tags, st.text(max_size=8)),
                max_size=30),
       st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3))
def test_trace_dump_then_load_is_identity(ops, meta):
    trace = Trace(meta=meta)
    live: list[int] = []
    for op, size, stream, tag, label in ops:
        if op in ("alloc", "small"):
            live.append(trace.alloc(size, stream, tag=tag, or_smaller=op == "small"))
        elif op == "free" and live:
            trace.free(live.pop(0))
        elif op == "stream" and live:
            trace.record_stream(live[-1], stream)
        elif op == "done" and live:
            trace.free_completed(live[-1])
        elif op == "sync":
            trace.synchronize()
        elif op == "empty":
            trace.empty_cache()
        elif op == "mark":
            trace.mark(label)
    out = io.StringIO()
    trace.dump(out)
    loaded = Trace.load(io.StringIO(out.getvalue()))
    assert loaded == trace
    assert loaded.tags == trace.tags and loaded.meta == trace.meta
    again = io.StringIO()
    loaded.dump(again)
    assert again.getvalue() == out.getvalue()


def test_trace_dump_then_load_through_a_file(tmp_path):
    trace = Trace(meta={"source": "test"})
    a = trace.alloc(3 << 20, category="activation", module="fc1")
    trace.mark("step")
    trace.free(a)
    path = tmp_path / "t.jsonl"
    trace.dump(path)
    assert Trace.load(path) == trace


# -- snapshot dict -> trace ---------------------------------------------------------------------

actions = st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc",
                           "segment_free", "segment_map", "segment_unmap", "oom", "snapshot",
                           "user_defined", "teleport"])
field_values = st.one_of(st.integers(-5, 2**65), st.sampled_from([0, 512, 2**21, 0x7F00]),
                         plain_values)
entries = st.fixed_dictionaries(
    {"action": st.one_of(actions, plain_values)},
    optional={"addr": st.one_of(st.sampled_from([0, 512, 1024]), field_values),
              "size": st.one_of(st.sampled_from([512, 2**20]), field_values),
              "stream": st.one_of(st.just(0), field_values)},
)
snapshots = st.one_of(
    plain_values,
    st.fixed_dictionaries(
        {"device_traces": st.one_of(st.lists(st.lists(st.one_of(entries, plain_values),
                                                      max_size=8), max_size=3), plain_values)},
        optional={"segments": st.one_of(
                      st.lists(st.fixed_dictionaries(
                          {}, optional={"device": field_values, "total_size": field_values}),
                          max_size=3),
                      plain_values),
                  "allocator_settings": st.one_of(
                      st.fixed_dictionaries({"PYTORCH_CUDA_ALLOC_CONF": plain_values}),
                      plain_values)},
    ),
)


@FAST
@given(snapshots, st.one_of(st.none(), st.integers(-2, 3)))
def test_snapshot_to_trace_of_arbitrary_data(snapshot, device):
    try:
        trace, facts = snapshot_to_trace(snapshot, device)
    except SnapshotError as exc:
        one_line(exc)
        return
    assert isinstance(facts.alloc_conf, (str, type(None)))
    for _, _, size, _, _ in trace.events():
        assert isinstance(size, int) and 0 <= size < 2**63
    try:
        simulate(trace)
    except TraceError as exc:
        one_line(exc)


# -- the allow-list unpickler -----------------------------------------------------------------

pickle_safe = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(max_size=8), st.binary(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), inner, max_size=5),
        st.frozensets(st.integers(), max_size=4), st.sets(st.text(max_size=3), max_size=4),
    ),
    max_leaves=30,
)


@FAST
@given(pickle_safe, st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_plain_data_round_trips_at_every_protocol(value, protocol):
    data = pickle.dumps(value, protocol)
    try:
        assert loads_plain(data) == value
    except RefusedPickle as exc:
        # Protocols 0-2 pickle bytes, sets and frozensets through globals (_codecs.encode,
        # builtins.set): a memory snapshot holds none of them, so they are refused.
        assert protocol <= 2 or protocol == 3 and "set" in str(exc)
        one_line(exc)


@FAST
@given(st.binary(max_size=400))
def test_unpickler_of_arbitrary_bytes(data):
    try:
        loads_plain(data)
    except InputError as exc:
        one_line(exc)


@FAST
@given(st.data())
def test_unpickler_of_corrupted_snapshots(data):
    whole = bytearray(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 1,
                                                         "size": 512, "pool_id": (0, 0)}]]},
                                   data.draw(st.integers(0, 5))))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(whole) - 1))
        whole[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(whole)))
    try:
        loads_plain(bytes(whole[:cut]))
    except InputError as exc:
        one_line(exc)


class _Call:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("func, args", [(os.system, ("true",)), (eval, ("1",)),
                                        (print, ("x",)), (Path, ("x",))])
def test_every_global_is_refused(protocol, func, args):
    with pytest.raises(RefusedPickle, match="refused: the pickle asks for"):
        loads_plain(pickle.dumps(_Call(func, *args), protocol))


PROBE_A_MEMORY_BOMB = """
import peakmem.trace.safe_pickle as safe
from peakmem.trace.safe_pickle import RefusedPickle, loads_plain
safe.memory_budget = lambda size: 64 * 2**20
bomb = b"\\x80\\x04](" + b"}" * 3_000_000 + b"e."  # ~200 MB of dicts from 3 MB
try:
    loads_plain(bomb)
except RefusedPickle as exc:
    print(exc)
"""


def test_the_probe_refuses_a_memory_bomb():
    # in a fresh interpreter (kept from when the probe forked the caller, whose freed-but-mapped
    # heap let the bomb fit under the cap in an xdist worker once in CI; the next test covers
    # a long-lived caller)
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PROBE_A_MEMORY_BOMB], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "needs more than 67108864 bytes of memory" in proc.stdout, proc.stdout


PROBE_AFTER_A_FREED_HEAP = """
import pickle
import peakmem.trace.safe_pickle as safe
from peakmem.trace.safe_pickle import RefusedPickle, loads_plain
safe.memory_budget = lambda size: 64 * 2**20

def mapped():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[0]) * 4096

before = mapped()
heap = [bytearray(100_000) for _ in range(5000)]  # 500 MB from glibc's heap (under mmap's threshold)
pin = bytearray(100_000)  # above them: the heap's top cannot be trimmed
del heap  # freed, still mapped (no malloc_trim)
print("freed but mapped", mapped() - before)
bomb = b"\\x80\\x04](" + b"}" * 3_000_000 + b"e."  # ~200 MB of dicts from 3 MB
try:
    loads_plain(bomb)
    print("bomb accepted")
except RefusedPickle as exc:
    print(exc)
snap = {"device_traces": [[{"action": "alloc", "addr": 512 * i, "size": 512, "stream": 0}
                           for i in range(3000)]]}
assert loads_plain(pickle.dumps(snap)) == snap
print("snapshot accepted")
"""


def test_the_probe_refuses_a_memory_bomb_after_a_freed_heap():
    # a long-lived process (an xdist worker, a bench worker) maps heap it has freed: a fork of
    # it reused that heap for the bomb's objects without growing its address space, so the
    # fork's cap (what the process maps + the budget) let ~200 MB of dicts through a 64 MiB
    # budget; the fresh-interpreter child's cap does not depend on the caller's history
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PROBE_AFTER_A_FREED_HEAP], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert int(lines[0].split()[-1]) >= 400 * 10**6, lines  # the heap stayed mapped
    assert "needs more than 67108864 bytes of memory" in lines[1], lines
    assert lines[2] == "snapshot accepted", lines


PROBE_IN_A_SMALL_THREAD = """
import threading
from peakmem.trace.safe_pickle import RefusedPickle, loads_plain, probe_stack_bytes

nested = b"\\x80\\x04}N" + b"\\x85" * 40_000 + b"Ns."  # a dict key nested 40000 tuples deep
assert len(loads_plain(nested)) == 1  # hashed in the main thread's 8 MiB: fine
print("main thread accepted")

def small():
    print("probe stack", probe_stack_bytes())
    try:
        loads_plain(nested)  # hashing it here would overflow this thread's 1 MiB
        print("small thread accepted")
    except RefusedPickle as exc:
        print(exc)

threading.stack_size(2**20)
thread = threading.Thread(target=small)
thread.start()
thread.join()
"""


def test_the_probe_has_the_calling_threads_stack():
    # ~70 bytes of C stack per level of tuple hash: 40000 levels overflow a 1 MiB thread stack
    # (a segfault of the caller) but not the main thread's 8 MiB; the child gets half of the
    # caller's stack, so the nesting is refused in the small thread before it can crash it
    import resource
    import subprocess
    import sys

    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    if soft != resource.RLIM_INFINITY and soft < 8 * 2**20:
        pytest.skip(f"RLIMIT_STACK {soft} < 8 MiB: the main thread would crash too")
    proc = subprocess.run([sys.executable, "-c", PROBE_IN_A_SMALL_THREAD], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["main thread accepted", f"probe stack {2**19}"], lines
    assert "crashed the unpickler (signal 11)" in lines[2], lines


def test_the_probe_refuses_a_hash_that_would_overflow_the_stack():
    bomb = b"\x80\x04}N" + b"\x85" * 2_000_000 + b"Ns."
    with pytest.raises(RefusedPickle, match="crashed the unpickler"):
        loads_plain(bomb)


def test_a_large_real_shaped_snapshot_passes_the_probe():
    from tests.inputs.hostile_corpus import entry

    snap = {"device_traces": [[entry("alloc", 512 * i, 512) for i in range(3000)]]}
    data = pickle.dumps(snap)
    assert len(data) > 16 * 1024  # over PROBE_MIN_BYTES: the probe runs
    assert loads_plain(data) == snap


# -- bench CSVs ---------------------------------------------------------------------------------

cells = st.one_of(
    st.sampled_from(["", "0", "1449", "-1", "nan", "inf", "1e308", "8.5", "True", "False",
                     "SUCCESSFUL", "OOM_CRASH", "x" * 50, "9" * 5000, "\ufeff", "\x00",
                     "input:300_output:10_depth:1_arch:pyramid_batch:32.out",
                     "input:300_output:1_depth:99999999999_arch:uniform_batch:0.out"]),
    st.text(max_size=12),
)
CSV_SETS = {
    "gpumemnet-mlp1": ("gpumemnet/mlp_data_step1.csv", ["Filename", "Max GPU Memory (MiB)"]),
    "gpumemnet-transformer": ("gpumemnet/transformer_data_sample17.csv",
                              ["Filename", "Max GPU Memory (MiB)", "Status"]),
    "timm": ("gpumemnet/timm_measured.csv",
             ["model", "batch_size", "measured_mib", "faketensor_mib"]),
    "xmem": ("xmem/xmem_runs.csv",
             ["run_dir", "model", "batch_size", "optimizer", "gpu_name", "gpu_total_mib",
              "measured_peak_mib", "real_oom", "estimator", "estimate_mib"]),
}


def _csv_text(columns: list[str], rows: list[list[str]]) -> str:
    import csv

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    writer.writerows(rows)
    return out.getvalue()


@FAST
@given(st.sampled_from(sorted(CSV_SETS)), st.data(), st.booleans())
def test_bench_csv_rows_are_checked(name, data, drop_column):
    import tempfile

    target, columns = CSV_SETS[name]
    columns = list(columns)
    if drop_column:
        columns.pop(data.draw(st.integers(0, len(columns) - 1)))
    rows = data.draw(st.lists(st.lists(cells, min_size=len(columns), max_size=len(columns) + 1),
                              max_size=4))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / target
        path.parent.mkdir(parents=True)
        path.write_text(_csv_text(columns, rows), encoding="utf-8")
        try:
            loaded = load_rows(name, tmp)
        except DatasetFormatError as exc:
            one_line(exc)
            assert str(path) in str(exc)
            return
        except DatasetUnavailable:
            return
    for row in loaded:
        assert 0 <= row.measured_peak_bytes < 2**63 and row.status in ("ok", "oom")
        assert row.gpu_total_bytes > 0


@FAST
@given(st.lists(st.lists(cells, min_size=12, max_size=12), max_size=4))
def test_groundtruth_csv_rows_are_checked(rows):
    import tempfile

    from peakmem.datasets.loaders import GROUNDTRUTH_COLUMNS

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "g.csv").write_text(_csv_text(list(GROUNDTRUTH_COLUMNS), rows))
        try:
            loaded = list(load_groundtruth(None, Path(tmp)))
        except DatasetFormatError as exc:
            one_line(exc)
            return
    for row in loaded:
        assert row.measured_peak_bytes >= 0 and row.gpu_total_bytes > 0
        parse_version(row.torch_version)


@FAST
@given(st.one_of(st.text(max_size=60),
                 st.lists(st.one_of(st.sampled_from(["[", "]", "(", ")", ",", "'conv2d'", "1",
                                                     "-1", "1.5", "None", "{}", "'x'"])),
                          max_size=30).map("".join)))
def test_layer_lists_parse_or_fail_cleanly(text):
    try:
        layers = parse_layer_list(text)
    except JobParseError:
        return
    for kind, numel, params in layers:
        assert isinstance(kind, str) and numel >= 0 and params >= 0


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000, "(" * 5000 + ")" * 5000, "[" + "1," * 10**5 + "]", "9" * 10_000,
     "[('a', " + "9" * 5000 + ", 1)]", "x" * (2 << 20)],
    ids=["open-brackets", "nested-parens", "long-flat-list", "huge-int", "huge-int-entry",
         "over-the-length-cap"],
)
def test_layer_list_bombs_fail_cleanly(text):
    with pytest.raises(JobParseError):
        parse_layer_list(text)


# -- flags: allocator config, byte sizes, torch versions, PEAKMEM_EAGER_RAM_BYTES ----------------

conf_tokens = st.lists(
    st.sampled_from(["max_split_size_mb", "expandable_segments", "garbage_collection_threshold",
                     "roundup_power2_divisions", "backend", "large_segment_size_mb",
                     "max_non_split_rounding_mb", "pinned_num_register_threads", ":", ",", "[",
                     "]", ">", "True", "False", "0", "1", "2", "20", "21", "64", "-1", "0.5",
                     "nan", "1e400", "9" * 30, "native", "cudaMallocAsync", " "]),
    max_size=14,
).map("".join)


@FAST
@given(st.one_of(st.text(max_size=40), conf_tokens),
       st.sampled_from([None, "2.4.1", "2.6.0", "2.10", "2.13.0"]))
def test_alloc_conf_parse_accepts_or_refuses(conf, version):
    try:
        config = AllocatorConfig.parse(conf, version)
    except AllocatorConfigError as exc:
        assert str(exc)
        return
    assert config.backend == "native"
    assert config.max_split_size > 0 and 0.0 <= config.garbage_collection_threshold < 1.0


@FAST
@given(st.one_of(st.text(max_size=20),
                 st.from_regex(r"\s*-?[0-9]{0,25}\.?[0-9]{0,5}\s*[kKmMgGtTiIbB]{0,3}\s*",
                               fullmatch=True)))
def test_byte_sizes_parse_or_refuse(text):
    try:
        value = parse_bytes(text)
    except BadInput as exc:
        one_line(exc)
        return
    assert isinstance(value, int) and 0 <= value < 2**64


@FAST
@given(st.integers(0, 2**30), st.sampled_from([("", 1), ("KiB", 2**10), ("GiB", 2**30),
                                                ("GB", 10**9), ("m", 2**20)]))
def test_byte_sizes_are_exact(number, unit):
    suffix, scale = unit
    assert parse_bytes(f"{number}{suffix}") == number * scale
    assert parse_bytes(f"{number}.5{suffix}") == (number * 10 + 5) * scale // 10


@FAST
@given(st.one_of(st.text(max_size=20),
                 st.from_regex(r"[0-9]{1,3}\.[0-9]{1,3}(\.[0-9]{1,3})?(\+cu[0-9]+)?",
                               fullmatch=True)))
def test_torch_versions_are_known_or_refused_by_name(text):
    try:
        key = parse_version(text)
    except UnknownTorchVersion as exc:
        one_line(exc)
        assert "known: 2.4, 2.5" in str(exc)
        return
    assert key in KNOWN_VERSIONS


@FAST
@given(st.one_of(st.text(max_size=25), st.sampled_from(["8GiB", "1e9", "-1", "nan", "inf",
                                                        "0", " 42 ", "1.5GiB", "9" * 40])))
def test_eager_ram_limit_reads_its_variable_or_names_it(text):
    from peakmem.capture.eager import eager_ram_limit

    if "\x00" in text:
        return  # an environment variable cannot hold NUL
    saved = os.environ.get("PEAKMEM_EAGER_RAM_BYTES")
    os.environ["PEAKMEM_EAGER_RAM_BYTES"] = text
    try:
        value = eager_ram_limit()
    except InputError as exc:
        one_line(exc)
        assert "PEAKMEM_EAGER_RAM_BYTES" in str(exc)
        return
    finally:
        if saved is None:
            del os.environ["PEAKMEM_EAGER_RAM_BYTES"]
        else:
            os.environ["PEAKMEM_EAGER_RAM_BYTES"] = saved
    assert isinstance(value, int) and 0 <= value < 2**63
    assert not math.isnan(value)
