"""Speaks the worker protocol of peakmem.measure.worker without a GPU: the "peak" is the batch
size in MiB; batch >= 64 runs out of memory; `--crash` exits without a result; `--unknown-peak`
finishes without a per-process reading (peak_source `unknown`)."""

import json
import sys
import time

print("ready", flush=True)
line = sys.stdin.readline()
if not line.strip():
    sys.exit(0)
request = json.loads(line)
argv = request["argv"]
if "--crash" in argv:
    sys.exit(3)
if "--sleep" in argv:
    time.sleep(float(argv[argv.index("--sleep") + 1]))
batch = int(argv[argv.index("--batch-size") + 1]) if "--batch-size" in argv else 1
result = {
    "peak_bytes": batch * 2**20,
    "peak_reserved_bytes": batch * 2**19,
    "peak_allocated_bytes": batch * 2**18,
    "context_bytes": 500 * 2**20,
    "status": "oom" if batch >= 64 else "ok",
    "gpu": "Fake GPU",
    "driver": "1",
    "cuda": "12.4",
    "torch": "2.13.0",
    "alloc_conf": request.get("env", {}).get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "seconds": 0.01,
    "steps": request["steps"],
    "steps_requested": request["steps"],
}
if "--unknown-peak" in argv:
    result.update(peak_bytes=0, context_bytes=0, peak_source="unknown",
                  peak_unknown="NVML listed other processes but never this one")
with open(request["out"], "w") as handle:
    json.dump(result, handle)
