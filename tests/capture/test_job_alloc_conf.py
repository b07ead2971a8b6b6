"""A job that sets PYTORCH_CUDA_ALLOC_CONF in its own process (capture.job_alloc_conf).

The job allocates 12 MiB, frees it, then allocates 14 MiB (both large-pool requests of at least
kMinLargeAlloc, 10 MiB, so rounded to 2 MiB: exactly 12 and 14 MiB). The native allocator's
cached 12 MiB block cannot hold the 14 MiB request, so it cudaMallocs a second segment: 26 MiB
reserved. With expandable_segments:True the large pool maps 20 MiB pages (kLargeBuffer) of one
segment: the 12 MiB request maps one page, the 14 MiB request reuses it: 20 MiB reserved.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from peakmem.capture.job_alloc_conf import environ_conf, job_conf, prepare_environment
from peakmem.estimate import EstimateError, estimate_command

MIB = 2**20
NATIVE = 26 * MIB
EXPANDABLE = 20 * MIB
VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


@pytest.fixture(autouse=True)
def clean_environment():
    """The jobs below run in this process and set the variables: put back as they were after
    each test. (Not `monkeypatch.delenv(name, raising=False)`: for a variable that is not set it
    records nothing to undo, so a job's own setting leaked into the rest of the xdist worker's
    tests: 9 failures in one CI run.)"""
    saved = {name: os.environ.pop(name, None) for name in VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _script(tmp_path: Path, before: str = "", after: str = "") -> Path:
    """`before` runs before the job's first CUDA tensor, `after` right after it."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""\
        import os, sys
        {before}
        import torch
        x = torch.empty(12 * 2**20, dtype=torch.uint8, device="cuda")
        {after}
        del x
        y = torch.empty(14 * 2**20, dtype=torch.uint8, device="cuda")
        with open(sys.argv[1], "w") as out:
            out.write(str(torch.cuda.memory_reserved()))
    """).format(before=before, after=after))
    return script


def _estimate(script: Path, tmp_path: Path, **kwargs):
    reading = tmp_path / "reading.txt"
    result = estimate_command(["python", str(script), str(reading)], gpu="h200",
                              torch_version="2.13", isolate=False, steps="all", mode="fake",
                              **kwargs)
    return result, int(reading.read_text())


def test_job_sets_expandable_segments_before_cuda_use(tmp_path):
    script = _script(tmp_path, before='os.environ["PYTORCH_CUDA_ALLOC_CONF"] = '
                                      '"expandable_segments:True"')
    result, in_job = _estimate(script, tmp_path)
    assert result.peak_reserved_bytes == EXPANDABLE
    assert in_job == EXPANDABLE  # the job's own reading simulates the same allocator
    assert result.alloc_conf == "expandable_segments:True"
    assert any("set its allocator configuration itself" in note for note in result.notes)


def test_default_without_the_job_setting(tmp_path):
    result, in_job = _estimate(_script(tmp_path), tmp_path)
    assert (result.peak_reserved_bytes, in_job, result.alloc_conf) == (NATIVE, NATIVE, "")
    assert not any("itself" in note for note in result.notes)


def test_memory_fraction_initialises_cuda_first(tmp_path):
    # set_per_process_memory_fraction initialises CUDA (torch reads the configuration then): a
    # setting made after it is ignored even before the first tensor
    script = _script(tmp_path, before='import torch\n'
                                      'torch.cuda.set_per_process_memory_fraction(0.5)\n'
                                      'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = '
                                      '"expandable_segments:True"')
    result, in_job = _estimate(script, tmp_path)
    assert (result.peak_reserved_bytes, in_job, result.alloc_conf) == (NATIVE, NATIVE, "")


INITIALISING_CALLS = [
    # each reaches torch.cuda._lazy_init in torch 2.13 (capture.cuda_init_calls)
    "torch.cuda.get_device_name(0)",
    "torch.cuda.get_device_properties(0)",
    "torch.cuda.get_device_capability()",
    "torch.cuda.is_bf16_supported()",
    "torch.cuda.current_device()",
    "torch.cuda.set_device(0)",
    "torch.cuda.synchronize()",
    "torch.cuda.current_stream()",
    "torch.cuda.default_stream()",
    "torch.cuda.mem_get_info()",
    "torch.cuda.get_rng_state()",
    "torch.cuda.initial_seed()",
    "torch.cuda.init()",
    "torch.cuda.device(0).__enter__()",
    "torch.cuda.device(None)",  # torch asks current_device() for the index
]
NOT_INITIALISING_CALLS = [
    "torch.cuda.is_available()",
    "torch.cuda.device_count()",
    "torch.cuda.memory_reserved()",
    "torch.cuda.memory_allocated()",
    "torch.cuda.manual_seed(0)",
    "torch.cuda.device(-1).__enter__()",
]


def _call_then_set(call: str) -> str:
    return ('import torch\n'
            f'print({call})\n'
            'os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"')


@pytest.mark.parametrize("call", INITIALISING_CALLS)
def test_a_call_that_initialises_cuda_reads_the_configuration_then(tmp_path, call):
    # torch read the configuration at that call: the job's later setting is ignored
    result, in_job = _estimate(_script(tmp_path, before=_call_then_set(call)), tmp_path)
    assert (result.peak_reserved_bytes, in_job, result.alloc_conf) == (NATIVE, NATIVE, "")


@pytest.mark.parametrize("call", NOT_INITIALISING_CALLS)
def test_a_call_that_does_not_initialise_cuda_leaves_the_later_setting(tmp_path, call):
    result, in_job = _estimate(_script(tmp_path, before=_call_then_set(call)), tmp_path)
    assert (result.peak_reserved_bytes, in_job) == (EXPANDABLE, EXPANDABLE)
    assert result.alloc_conf == "expandable_segments:True"


def test_every_initialising_call_is_checked_against_torch_source():
    """The registry's names exist in the installed torch and call `_lazy_init` there, directly
    or through `get_device_properties` / `current_device` / `cudart`, or are C++-initialising."""
    import importlib
    import inspect

    from peakmem.capture.cuda_init_calls import INITIALISING

    via = ("_lazy_init()", "get_device_properties(", "current_device()", "cudart()",
           "get_rng_state(", "_cuda_setDevice(")
    for module_name, names in INITIALISING.items():
        module = importlib.import_module(module_name)
        for name in names:
            source = inspect.getsource(getattr(module, name))
            body = source.split('"""')[-1] if source.count('"""') >= 2 else source
            assert any(token in body for token in via), (module_name, name)


def test_setting_after_the_first_cuda_tensor_is_ignored(tmp_path):
    script = _script(tmp_path, after='os.environ["PYTORCH_CUDA_ALLOC_CONF"] = '
                                     '"expandable_segments:True"')
    result, in_job = _estimate(script, tmp_path)
    assert (result.peak_reserved_bytes, in_job, result.alloc_conf) == (NATIVE, NATIVE, "")


SETDEFAULT = 'os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")'


def test_setdefault_keeps_the_callers_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    result, in_job = _estimate(_script(tmp_path, before=SETDEFAULT), tmp_path)
    assert (result.peak_reserved_bytes, in_job) == (NATIVE, NATIVE)
    assert result.alloc_conf == "expandable_segments:False"


def test_setdefault_keeps_peakmem_alloc_conf(tmp_path):
    # --alloc-conf is in the job's environment from its start, as on the GPU
    result, in_job = _estimate(_script(tmp_path, before=SETDEFAULT), tmp_path,
                               alloc_conf="max_split_size_mb:100")
    assert (result.peak_reserved_bytes, in_job) == (NATIVE, NATIVE)
    assert result.alloc_conf == "max_split_size_mb:100"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ  # put back after the capture


def test_setdefault_applies_when_nothing_was_set(tmp_path):
    result, _ = _estimate(_script(tmp_path, before=SETDEFAULT), tmp_path)
    assert (result.peak_reserved_bytes, result.alloc_conf) == (EXPANDABLE, "expandable_segments:True")


def test_invalid_value_set_by_the_job_fails_it_like_torch(tmp_path):
    # torch: RuntimeError from CUDAAllocatorConfig's parser at the first CUDA allocation
    script = _script(tmp_path, before='os.environ["PYTORCH_CUDA_ALLOC_CONF"] = '
                                      '"expandable_segments:Maybe"\n'
                                      'print("started")')
    with pytest.raises(EstimateError) as info:
        _estimate(script, tmp_path)
    assert info.value.exit_code == 1 and info.value.reason == "raised"
    assert "RuntimeError" in info.value.message and "expandable_segments" in info.value.message
    assert 'job.py", line 5' in info.value.traceback  # the first CUDA tensor's line


def test_job_choosing_an_unsimulated_backend_is_unsupported(tmp_path):
    script = _script(tmp_path, before='os.environ["PYTORCH_CUDA_ALLOC_CONF"] = '
                                      '"backend:cudaMallocAsync"')
    with pytest.raises(EstimateError) as info:
        _estimate(script, tmp_path)
    assert info.value.exit_code == 3 and "cudaMallocAsync" in str(info.value)


def test_cli_in_a_child_process(tmp_path):
    script = _script(tmp_path, before='os.environ["PYTORCH_CUDA_ALLOC_CONF"] = '
                                      '"expandable_segments:True"')
    env = {name: value for name, value in os.environ.items() if name not in VARIABLES}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    done = subprocess.run(
        [sys.executable, "-m", "peakmem", "estimate", "--gpu", "h200", "--torch", "2.13", "--json",
         "--steps", "all", "--mode", "fake", "--", "python", str(script), str(tmp_path / "r.txt")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["alloc_conf"] == "expandable_segments:True"
    assert report["peak_reserved_bytes"] == EXPANDABLE
    assert int((tmp_path / "r.txt").read_text()) == EXPANDABLE
    assert any("itself" in note for note in report["notes"])


# -- which variables each torch reads ----------------------------------------------------------


def test_pytorch_alloc_conf_read_from_2_10_only_when_the_cuda_name_is_unset():
    generic = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    assert environ_conf(generic, "2.4") is None
    assert environ_conf(generic, "2.13") == "expandable_segments:True"
    both = {**generic, "PYTORCH_CUDA_ALLOC_CONF": ""}  # set, even empty: it wins
    assert environ_conf(both, "2.13") == ""


def test_job_conf_is_what_torch_would_read_that_changed():
    start = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:100", "PYTORCH_ALLOC_CONF": None}
    # a variable this torch reads after the one already set changes nothing
    later = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:100", "PYTORCH_ALLOC_CONF": "x"}
    assert job_conf(start, "2.13", later) is None
    assert job_conf(start, "2.13", {}) == ""  # the job unset it: the default allocator
    assert job_conf({}, "2.4", {"PYTORCH_ALLOC_CONF": "x"}) is None


def test_prepare_environment():
    environ = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    prepare_environment("expandable_segments:True", "2.13", environ)
    assert environ == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}  # already what torch reads
    prepare_environment("", "2.13", environ)  # --alloc-conf "": the default, nothing set
    assert environ == {}
    prepare_environment("max_split_size_mb:100", "2.4", environ)
    assert environ == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:100"}


def test_a_callable_that_sets_it_before_its_first_cuda_tensor():
    import torch

    from peakmem.estimate import estimate

    def job():
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        x = torch.empty(12 * MIB, dtype=torch.uint8, device="cuda")
        del x
        return torch.empty(14 * MIB, dtype=torch.uint8, device="cuda")

    result = estimate(job, gpu="h200", torch_version="2.13", steps="all", mode="fake")
    assert (result.peak_reserved_bytes, result.alloc_conf) == (EXPANDABLE, "expandable_segments:True")


def test_warm_processes_serve_any_allocator_configuration():
    # only the capture in the job's own process reads it: not part of a warm process's identity
    from peakmem.jobs.zygote import startup_env

    env = {"PYTORCH_CUDA_ALLOC_CONF": "a", "PYTORCH_ALLOC_CONF": "b", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
    assert startup_env(env) == {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
