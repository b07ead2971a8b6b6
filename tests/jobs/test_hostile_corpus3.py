"""A third adversarial corpus: hostile jobs (tests/data/hostile_scripts3) and hostile input
files that test_hostile_corpus.py and test_hostile_corpus2.py do not cover.

Each case names what went wrong before its fix. Jobs run through the real command line
(`python -m peakmem estimate --json`); input files through click's CliRunner (fast).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from peakmem.cli.main import main

CORPUS = Path(__file__).resolve().parents[1] / "data" / "hostile_scripts3"
SRC = Path(__file__).resolve().parents[2] / "src"
HEADER = {"format": "peakmem-trace", "version": 1, "meta": {},
          "tags": [["parameter", "fc1", "forward", "aten::mm"]]}


def _simulate(tmp_path: Path, events: list[list[int]], *args: str) -> dict:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join([json.dumps(HEADER), *map(json.dumps, events)]) + "\n")
    result = CliRunner().invoke(main, ["simulate", str(path), "--json", *args])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


# -- trace files ------------------------------------------------------------------------------


def test_zero_byte_allocations_take_no_block(tmp_path):
    # CUDACachingAllocator::allocate(0) returns a null pointer without a block; the replay gave
    # each a 512-byte block: 100000 empty tensors "held" 48.8 MiB (1e6: 488 MiB, 40 s)
    zeros = [[0, i, 0, 0, -1] for i in range(100_000)]
    events = [*zeros, [2, 7, 0, 3, -1], [1, 7, 0, 0, -1], [0, 100_000, 512, 0, 0]]
    peaks = _simulate(tmp_path, events)
    assert peaks["peak_allocated_bytes"] == 512
    assert peaks["peak_reserved_bytes"] == 2 * 2**20
    # and such an id is still allocated once and freed once
    path = tmp_path / "trace.jsonl"
    lines = [HEADER, [0, 0, 0, 0, -1], [1, 0, 0, 0, -1], [1, 0, 0, 0, -1]]
    path.write_text("\n".join(map(json.dumps, lines)) + "\n")
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 2
    assert "event 2: free of id 0, which is not allocated" in result.stderr


# -- `peakmem batch` ---------------------------------------------------------------------------


FAKE = "peakmem.service.estimators:fake_estimator"


@pytest.mark.parametrize("link", ["same-name", "symlink", "hardlink"])
def test_batch_results_file_that_is_the_jobs_file_is_refused(tmp_path, link):
    # the results were appended to the jobs file: every later run failed on "id 'a' appears
    # twice", and the jobs file was no longer a jobs file
    jobs = tmp_path / "jobs.jsonl"
    line = {"id": "a", "command": ["python", "t.py"], "files": {"t.py": "print(1)"}}
    jobs.write_text(json.dumps(line) + "\n")
    output = jobs if link == "same-name" else tmp_path / "out.jsonl"
    if link == "symlink":
        output.symlink_to(jobs.name)
    elif link == "hardlink":
        os.link(jobs, output)
    before = jobs.read_text()
    result = CliRunner().invoke(main, ["batch", "--in-process", "--estimator", FAKE, str(jobs),
                                       "-o", str(output)])
    assert result.exit_code == 2, result.output
    errors = [text for text in result.stderr.splitlines() if text.startswith("peakmem: error:")]
    assert len(errors) == 1 and "is the jobs file" in errors[0], result.stderr
    assert jobs.read_text() == before
