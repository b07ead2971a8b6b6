"""A preloaded module that sets an environment variable when imported (Lightning sets
PYTORCH_NVML_BASED_CUDA_CHECK): the warm process still serves requesters started with the
environment it was started with, and its jobs see the variable as a cold job (which imports the
module itself) does."""

from __future__ import annotations

import json
import os
import textwrap

from peakmem.estimate import estimate_command
from peakmem.jobs import zygote_client
from peakmem.jobs.zygote import environment_changes, with_changes

SETS_ENV = "PYTORCH_PEAKMEM_TEST_PRELOADED"


def test_environment_changes_round_trip():
    before = {"A": "1", "B": "2", "C": "3"}
    after = {"A": "1", "B": "20", "D": "4"}
    changes = environment_changes(before, after)
    assert changes == {"B": "20", "D": "4", "C": None}
    assert with_changes({"A": "1", "B": "2", "C": "3", "E": "5"}, changes) == {
        "A": "1", "B": "20", "D": "4", "E": "5"}


def test_a_preload_that_sets_a_variable_serves_its_jobs_with_it(tmp_path, monkeypatch):
    modules = tmp_path / "mods"
    modules.mkdir()
    (modules / "sets_env_on_import.py").write_text(
        f"import os\nos.environ[{SETS_ENV!r}] = '1'\n")
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, sys
        import torch
        import sets_env_on_import
        x = torch.zeros(256, device="cuda")
        print("SEEN=" + json.dumps(os.environ.get({SETS_ENV!r})))
    """))
    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("PEAKMEM_RUNTIME_DIR", str(directory))
    monkeypatch.delenv("PEAKMEM_WARM", raising=False)
    monkeypatch.delenv(SETS_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(modules), os.environ.get("PYTHONPATH", "")])))
    info = zygote_client.start(["sets_env_on_import"], idle_seconds=120)
    try:
        assert info["preload_errors"] == []
        seen = {}
        for flag in ("1", "0"):
            monkeypatch.setenv("PEAKMEM_WARM", flag)
            log = tmp_path / f"log{flag}"
            estimate = estimate_command(["python", str(script)], gpu="a100-40gb", job_log=log)
            warm_notes = [n for n in estimate.notes if "warm job process" in n]
            assert warm_notes == ([zygote_client.WARM_NOTE] if flag == "1" else []), warm_notes
            line = next(x for x in log.read_text().splitlines() if x.startswith("SEEN="))
            seen[flag] = json.loads(line.removeprefix("SEEN="))
            if flag == "1":
                assert zygote_client.status()["served"] == 1
        assert seen == {"1": "1", "0": "1"}
    finally:
        monkeypatch.delenv("PEAKMEM_WARM", raising=False)
        zygote_client.stop()
