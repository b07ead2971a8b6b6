"""A one-run measurement process for sweeps: `python -m peakmem.measure.worker`.

It imports torch (and the modules named by --preimport) first, prints `ready`, then waits for one
JSON line on stdin naming the run, measures it in this fresh process and writes the result JSON.
A sweep starts the next worker while the current one runs, so the import cost is hidden while
every run still gets a process of its own (no cached memory, loaded kernels or context from an
earlier run can leak into its peak).

Request: {"argv": ["python", "job.py", ...], "steps": 3, "timeout": 240, "out": "r.json",
          "snapshot": null, "snapshot_stacks": "python", "env": {"K": "V"}}
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
from pathlib import Path


def _preimport(modules: list[str]) -> None:
    for name in modules:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def serve_one(request: dict, make_probe) -> int:
    from peakmem.jobs.runner import JobSpec, JobSpecError
    from peakmem.measure.session import MeasureOptions, NoGPUError, measure_job

    out = Path(request["out"])
    os.environ.update({str(k): str(v) for k, v in request.get("env", {}).items()})
    snapshot = request.get("snapshot")
    options = MeasureOptions(
        steps=request.get("steps", 3),
        timeout=request.get("timeout"),
        snapshot=Path(snapshot) if snapshot else None,
        snapshot_stacks=request.get("snapshot_stacks", "python"),
        job_stdout=sys.stderr,
    )
    try:
        spec = JobSpec.parse(request["argv"])
        probe = make_probe()
        try:
            result = measure_job(spec, probe, options).to_json()
        finally:
            probe.close()
    except (JobSpecError, NoGPUError) as exc:
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preimport", default="", help="comma-separated modules to import first")
    parser.add_argument("--device-index", type=int, default=0)
    parser.add_argument(
        "--fake-probe",
        action="store_true",
        help="measure nothing (a FakeProbe): tests the pipeline without a GPU",
    )
    args = parser.parse_args(argv)
    import torch  # noqa: F401  - the expensive import, done before the request arrives

    import peakmem.measure.session  # noqa: F401

    # what a first optimizer step or checkpoint imports lazily (torch._dynamo pulls in sympy):
    # seconds per run if left to the job
    _preimport(["pynvml", "peakmem.measure.cuda_probe", "torch._dynamo", "torch.utils.checkpoint"])
    _preimport([m for m in args.preimport.split(",") if m])
    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line.strip():
        return 0  # the sweep ended without a run for this worker
    request = json.loads(line)
    # nobody reads our stdout after `ready`: send anything written to fd 1 (C libraries too) to
    # stderr, the sweep's log, so that a full pipe can never block the run
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), 1)

    def make_probe():
        if args.fake_probe:
            from peakmem.measure.fake_probe import FakeProbe

            return FakeProbe()
        from peakmem.measure.cuda_probe import CudaProbe

        return CudaProbe(args.device_index)

    return serve_one(request, make_probe)


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown (seconds with torch._dynamo loaded): the result
    is on disk and the driver frees the GPU memory of the process anyway."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())
