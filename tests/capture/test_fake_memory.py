"""Memory readings during a capture are the caching-allocator simulation's values at that moment."""

import pickle

import pytest
import torch

from peakmem.allocator import simulate
from peakmem.allocator.config import AllocatorConfig
from peakmem.capture import capture_callable
from peakmem.capture.fake_memory import ARRAY_STATS, POOLS, SimulatedMemory, allocator_target
from peakmem.estimate import api
from peakmem.trace.events import Trace

MIB = 2**20


def _prefix(trace: Trace, length: int) -> Trace:
    out = Trace(meta=dict(trace.meta))
    for kind, ident, size, stream, tag in list(trace.events())[:length]:
        out._append(kind, ident, size, stream, tag)
    return out


def _churn_job(seen: dict) -> None:
    """Allocations and frees of mixed sizes; reads every reading after each phase."""
    keep = [torch.empty(3 * MIB + 7, dtype=torch.uint8, device="cuda")]
    temp = [torch.empty(n * 1000 + 1, device="cuda") for n in range(1, 40)]
    big = torch.empty(25 * MIB, dtype=torch.uint8, device="cuda")
    del temp
    seen["after_free"] = (
        torch.cuda.memory_allocated(),
        torch.cuda.memory_reserved(),
        torch.cuda.max_memory_allocated(),
        torch.cuda.max_memory_reserved(),
    )
    del big
    keep.append(torch.empty(5 * MIB, dtype=torch.uint8, device="cuda"))
    seen["end"] = (
        torch.cuda.memory_allocated(),
        torch.cuda.memory_reserved(),
        torch.cuda.max_memory_allocated(),
        torch.cuda.max_memory_reserved(),
    )


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:21"])
def test_readings_are_the_simulated_allocator_at_that_moment(a100, stack24, conf):
    seen: dict = {}
    with allocator_target(conf, "2.4.1"):
        result = capture_callable(_churn_job, seen, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    trace = result.trace
    # replay the trace up to each reading: the job saw exactly those values
    allocs = [i for i, (kind, *_rest) in enumerate(trace.events()) if kind == 0]
    config = AllocatorConfig.parse(conf, "2.4.1")
    frees_after_big = 39  # the first reading came after the 25 MiB block and `del temp`
    first = simulate(_prefix(trace, allocs[-2] + 1 + frees_after_big), config, "2.4.1")
    assert seen["after_free"] == (
        first.final_allocated_bytes,
        first.final_reserved_bytes,
        first.peak_allocated_bytes,
        first.peak_reserved_bytes,
    )
    last = simulate(_prefix(trace, allocs[-1] + 1), config, "2.4.1")
    assert seen["end"] == (
        last.final_allocated_bytes,
        last.final_reserved_bytes,
        last.peak_allocated_bytes,
        last.peak_reserved_bytes,
    )
    allocated, reserved, _max_alloc, _max_reserved = seen["end"]
    assert reserved > allocated  # the cache keeps freed blocks: reserved != allocated


def test_alloc_conf_changes_what_the_job_reads(a100, stack24):
    def job(seen):
        torch.empty(30 * MIB, dtype=torch.uint8, device="cuda")
        x = torch.empty(3 * MIB, dtype=torch.uint8, device="cuda")
        seen.append((torch.cuda.memory_reserved(), x.numel()))

    readings = []
    for conf in ("", "expandable_segments:True"):
        seen: list = []
        est = api.estimate(job, seen, gpu=a100, torch_version="2.4.1", alloc_conf=conf, mode="fake")
        readings.append(seen[0][0])
        assert est.alloc_conf == conf
    # default: the 30 MiB segment (freed, cached) is split for the 3 MiB block;
    # expandable: the segment is mapped in 20 MiB pages, two of them for 30 MiB
    assert readings[0] == 30 * MIB
    assert readings[1] == 40 * MIB


@pytest.mark.parametrize("mode", ["fake", "eager"])
def test_reset_peak_memory_stats_resets_the_peaks_as_cuda_does(a100, stack24, mode):
    seen = {}

    def job():
        big = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda")
        small = torch.empty(1000, device="cuda")
        del big
        seen["before"] = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        seen["reset"] = (torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated())
        seen["reserved_peak"] = torch.cuda.max_memory_reserved()
        more = torch.empty(4000, device="cuda")
        seen["after"] = (torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated())
        torch.cuda.reset_max_memory_allocated()
        seen["stats_peak"] = torch.cuda.memory_stats()["allocated_bytes.all.peak"]
        del small, more

    result = capture_callable(job, gpu=a100, stack=stack24, mode=mode)
    assert result.error is None, result.error_text
    assert seen["before"] == 64 * MIB + 4096
    assert seen["reset"] == (4096, 4096)
    assert seen["reserved_peak"] == 64 * MIB + 2 * MIB  # still cached: reserved stays
    assert seen["after"] == (4096 + 16384, 4096 + 16384)
    assert seen["stats_peak"] == 4096 + 16384


def test_memory_stats_has_the_real_key_names_and_consistent_values(a100, stack24):
    seen = {}

    def job():
        a = torch.empty(1000, device="cuda")  # small pool
        b = torch.empty(8 * MIB, dtype=torch.uint8, device="cuda")  # large pool
        seen["stats"] = dict(torch.cuda.memory_stats())
        seen["nested"] = torch.cuda.memory_stats_as_nested_dict()
        seen["allocated"] = torch.cuda.memory_allocated()
        seen["accel"] = torch.accelerator.memory_allocated()
        del a, b

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    stats = seen["stats"]
    for name in ARRAY_STATS:
        for pool in POOLS:
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{metric}" in stats
    for counter in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                    "num_device_free", "max_split_size", "oversize_allocations.current",
                    "oversize_segments.peak"):
        assert counter in stats
    assert list(stats) == sorted(stats)
    assert stats["allocated_bytes.all.current"] == seen["allocated"] == seen["accel"] == 4096 + 8 * MIB
    assert stats["allocated_bytes.small_pool.current"] == 4096
    assert stats["allocated_bytes.large_pool.current"] == 8 * MIB
    assert stats["requested_bytes.all.current"] == 4000 + 8 * MIB
    assert stats["reserved_bytes.small_pool.current"] == 2 * MIB
    assert stats["reserved_bytes.large_pool.current"] == 20 * MIB  # kLargeBuffer for 1-10 MiB
    assert stats["segment.all.current"] == 2 and stats["allocation.all.current"] == 2
    assert stats["num_device_alloc"] == 2 and stats["max_split_size"] == -1
    assert stats["inactive_split_bytes.large_pool.current"] == 12 * MIB  # the split remainder
    assert seen["nested"]["allocated_bytes"]["all"]["current"] == 4096 + 8 * MIB


def test_mem_get_info_summary_and_snapshot(a100, stack24, tmp_path):
    seen = {}
    dump = tmp_path / "snap.pickle"

    def job():
        torch.cuda.memory._record_memory_history(max_entries=10000)
        x = torch.empty(8 * MIB, dtype=torch.uint8, device="cuda")
        seen["info"] = torch.cuda.mem_get_info()
        seen["reserved"] = torch.cuda.memory_reserved()
        seen["summary"] = torch.cuda.memory_summary()
        seen["segments"] = torch.cuda.memory_snapshot()
        seen["snapshot"] = torch.cuda.memory._snapshot()
        torch.cuda.memory._dump_snapshot(str(dump))
        torch.cuda.memory._record_memory_history(enabled=None)
        seen["processes"] = torch.cuda.list_gpu_processes()
        seen["utilization"] = torch.cuda.utilization()
        del x

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    context = int(stack24.context_for(a100).value)
    free, total = seen["info"]
    assert total == a100.total_memory_bytes
    assert free == total - context - seen["reserved"]
    assert "Allocated memory" in seen["summary"] and "20480 KiB" in seen["summary"]
    assert sum(s["total_size"] for s in seen["segments"]) == seen["reserved"] == 20 * MIB
    blocks = seen["segments"][0]["blocks"]
    assert [b["state"] for b in blocks] == ["active_allocated", "inactive"]
    assert blocks[0]["size"] == 8 * MIB
    assert seen["snapshot"]["segments"] == seen["segments"]
    with open(dump, "rb") as handle:  # the test's own file
        assert pickle.load(handle)["segments"] == seen["segments"]
    assert "GPU:0" in seen["processes"] and seen["utilization"] == 0
    assert any("_record_memory_history" in note for note in result.notes)


def test_empty_cache_releases_simulated_segments(a100, stack24):
    seen = {}

    def job():
        x = torch.empty(30 * MIB, dtype=torch.uint8, device="cuda")
        del x
        seen["cached"] = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        seen["emptied"] = torch.cuda.memory_reserved()

    capture_callable(job, gpu=a100, stack=stack24)
    assert seen == {"cached": 30 * MIB, "emptied": 0}


def test_no_reading_no_replay(a100, stack24, monkeypatch):
    calls = []
    original = SimulatedMemory.sync
    monkeypatch.setattr(SimulatedMemory, "sync", lambda self: calls.append(1) or original(self))

    def job():
        model = torch.nn.Linear(32, 32).cuda()
        model(torch.randn(4, 32, device="cuda")).sum().backward()

    capture_callable(job, gpu=a100, stack=stack24)
    assert calls == []


# -- set_per_process_memory_fraction -----------------------------------------------------------
def _fill(fraction, catch, seen):
    torch.cuda.set_per_process_memory_fraction(fraction)
    seen["fraction"] = torch.cuda.get_per_process_memory_fraction()
    held = []
    for _ in range(20):
        try:
            held.append(torch.empty(100 * MIB, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError as exc:
            if not catch:
                raise
            seen["error"] = str(exc)
            seen["retries"] = torch.cuda.memory_stats()["num_ooms"]
            break
    seen["held"] = len(held)
    del held
    seen["after"] = torch.empty(50 * MIB, dtype=torch.uint8, device="cuda").numel()


def test_memory_fraction_raises_cuda_oom_in_the_job_where_the_capped_allocator_runs_out(a100):
    seen = {}
    est = api.estimate(_fill, 0.01, True, seen, gpu=a100, torch_version="2.4.1", mode="fake")
    cap = int(0.01 * a100.total_memory_bytes)
    assert seen["fraction"] == 0.01
    assert seen["held"] == cap // (100 * MIB)
    assert seen["error"].startswith("CUDA out of memory. Tried to allocate 100.00 MiB.")
    assert seen["retries"] == 1 and seen["after"] == 50 * MIB
    assert est.capture.trace.meta["memory_fraction"] == 0.01
    assert not est.oom  # the job caught it and went on, as it would on the GPU
    assert est.peak_reserved_bytes <= cap
    assert any("caught 1 CUDA out-of-memory" in note for note in est.notes)


def test_uncaught_simulated_oom_is_reported_by_the_estimate_with_its_place(a100):
    seen = {}
    est = api.estimate(_fill, 0.01, False, seen, gpu=a100, torch_version="2.4.1", mode="auto")
    assert est.oom and not est.fits and est.mode == "fake"
    assert any("ran out of memory at test_fake_memory.py:" in note for note in est.notes)
    assert est.peak_reserved_bytes <= int(0.01 * a100.total_memory_bytes)


def test_estimate_caps_capacity_at_the_recorded_fraction(a100, stack24):
    def job():
        torch.cuda.set_per_process_memory_fraction(0.5)
        seen.append(torch.cuda.memory_reserved())
        x = torch.empty(10 * MIB, dtype=torch.uint8, device="cuda")
        del x

    seen: list = []
    capture = capture_callable(job, gpu=a100, stack=stack24)
    assert capture.error is None
    # the same trace with a larger allocation than half the GPU: the estimate reports OOM
    capture.trace.alloc(int(0.6 * a100.total_memory_bytes))
    est = api.estimate_capture(capture, a100, stack24, torch_version="2.4.1")
    assert est.oom and "fraction 0.5" in " ".join(est.notes)
    capture.trace.meta.pop("memory_fraction")
    assert not api.estimate_capture(capture, a100, stack24, torch_version="2.4.1").oom


@pytest.mark.parametrize(("value", "error"), [(1, TypeError), (1.5, ValueError)])
def test_memory_fraction_is_validated_as_torch_does(a100, stack24, value, error):
    def job():
        torch.cuda.set_per_process_memory_fraction(value)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert isinstance(result.error, error)


def test_raw_allocator_calls_and_device_queries(a100, stack24):
    seen = {}

    def job():
        pointer = torch.cuda.caching_allocator_alloc(3 * MIB)
        seen["during"] = torch.cuda.memory_allocated()
        torch.cuda.caching_allocator_delete(pointer)
        seen["after"] = torch.cuda.memory_allocated()
        seen["used"] = torch.cuda.device_memory_used()
        seen["reserved"] = torch.cuda.memory_reserved()
        seen["backend"] = torch.cuda.get_allocator_backend()
        seen["blas"] = torch.cuda.current_blas_handle()

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    context = int(stack24.context_for(a100).value)
    assert seen["during"] == 3 * MIB and seen["after"] == 0
    assert seen["used"] == context + seen["reserved"] == context + 20 * MIB
    assert seen["backend"] == "native" and seen["blas"] == 0


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: torch.cuda.MemPool(allocator=object()),
         "torch.cuda.MemPool with a custom allocator"),
        (lambda: torch.cuda.memory.change_current_allocator(None), "a custom CUDA allocator"),
        (lambda: torch.cuda.memory._set_allocator_settings("expandable_segments:True"),
         "changing the CUDA allocator settings at run time"),
    ],
)
def test_allocator_replacements_are_refused_by_name(a100, stack24, call, what):
    from peakmem.capture import Unsupported

    result = capture_callable(call, gpu=a100, stack=stack24)
    assert isinstance(result.error, Unsupported)
    assert str(result.error) == f"peakmem does not support {what} yet"
