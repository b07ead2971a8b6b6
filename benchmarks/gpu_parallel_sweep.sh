#!/usr/bin/env bash
# One GPU lease spent on ground truth (issue 4) and the T5 / bf16 facts (docs/MEASURE.md "Next
# lease"): four sweep processes side by side on one large GPU, each with its own CSV (merged on the
# CPU machine by benchmarks/merge_parallel_sweep.py), a device-wide memory monitor so that rows
# measured while the device was nearly full can be dropped, the software versions of the image,
# and a T5 allocator snapshot. Usage (on the device machine, OUT set):
#   bash benchmarks/gpu_parallel_sweep.sh TOTAL_SECONDS
# Per-process NVML readings and torch's counters are per process, so a neighbour does not change
# a row unless the device runs out of memory (then the allocator frees its cache and retries, or
# the run ends in OOM): the monitor says when that could have happened. `seconds` of these rows
# are not solo timings (the GPU was shared).
set -u
TOTAL=${1:-480}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
T0=$SECONDS
el() { echo $((SECONDS - T0)); }
say() { echo "[$(el)s] $*" | tee -a "$OUT/run.log"; }
mkdir -p "$OUT/sweeps"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee -a "$OUT/run.log"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in *H100*) G=h100-80gb ;; *H200*) G=h200 ;; *) G=$(python3 -c "import sys; sys.path.insert(0,'src'); from peakmem.measure.groundtruth import profile_name; print(profile_name('$NAME'))") ;; esac
say "profile $G"
# device-wide used memory, 5 Hz, epoch seconds (for dropping rows measured near a full device)
nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 200 > "$OUT/device_memory.csv" 2>/dev/null &
MON=$!

# 1. versions of the image (the sweep rows record torch / CUDA / driver only)
python3 - > "$OUT/versions.json" 2>>"$OUT/run.log" <<'PY'
import importlib, json, platform, sys
out = {"python": platform.python_version()}
for name in ["torch", "torchvision", "transformers", "timm", "accelerate", "pynvml", "numpy"]:
    try:
        out[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:  # noqa: BLE001
        out[name] = f"missing: {type(exc).__name__}"
import torch
out["cuda"] = torch.version.cuda
out["cudnn"] = torch.backends.cudnn.version()
out["gpu"] = torch.cuda.get_device_name(0)
print(json.dumps(out, indent=1))
PY
cat "$OUT/versions.json" | tee -a "$OUT/run.log"

# 2. four sweeps side by side: the zoo forward and in reverse group order, GPUMemNet both ways
python3 - <<'PY'
import pathlib
for name in ["h200", "gpumemnet"]:
    text = pathlib.Path(f"benchmarks/sweeps/{name}.toml").read_text()
    head, *groups = text.split("\n[[")  # [[group]] and [[run]] tables, each with what follows it
    pathlib.Path(f"/tmp/{name}_rev.toml").write_text(head + "".join("\n[[" + g.rstrip("\n") + "\n" for g in reversed(groups)))
PY
SB=$((TOTAL - $(el) - 45))
say "== sweeps, $SB s each"
[ -f "benchmarks/groundtruth/$G.csv" ] && cp "benchmarks/groundtruth/$G.csv" "$OUT/sweeps/a.csv"
cp "$OUT/sweeps/a.csv" "$OUT/sweeps/c.csv" 2>/dev/null
i=0
for spec in "a benchmarks/sweeps/h200.toml" "c /tmp/h200_rev.toml" "b benchmarks/sweeps/gpumemnet.toml" "d /tmp/gpumemnet_rev.toml"; do
  set -- $spec
  timeout $((SB + 30)) python3 benchmarks/sweep.py "$2" --gpu "$G" --csv "$OUT/sweeps/$1.csv" --log "/tmp/sweep_$1.log" \
    --snapshot-dir /tmp/snaps --budget-seconds "$SB" > "$OUT/sweeps/$1.out" 2>&1 &
  eval "P$1=\$!"
  i=$((i + 1))
done

# 3. the T5 facts: SDPA's backend for T5's permuted bias, then an allocator snapshot of t5-small bf16
python3 - >> "$OUT/t5_facts.txt" 2>&1 <<'PY'
import torch
q = torch.randn(2, 8, 512, 64, device="cuda")
k, v = torch.randn_like(q), torch.randn_like(q)
bias = torch.randn(512, 512, 8, device="cuda").permute(2, 0, 1)[None]
for label, mask in [("permuted", bias), ("contiguous", bias.contiguous())]:
    for dt in [torch.float32, torch.bfloat16]:
        print(label, dt, "stride", mask.stride(), "choice", torch._fused_sdp_choice(q.to(dt), k.to(dt), v.to(dt), mask.to(dt) if label == "contiguous" else mask.to(dt), 0.1, False, scale=1.0))
print("0 math, 1 flash, 2 efficient, 3 cudnn (torch/nn/attention SDPBackend order)")
print("backends:", [b for b in dir(torch.nn.attention.SDPBackend) if not b.startswith("_")])
print("allow_fp16_bf16_reduction_math_sdp", torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp() if hasattr(torch.backends.cuda, "allow_fp16_bf16_reduction_math_sdp") else "n/a")
PY
cat "$OUT/t5_facts.txt" | tee -a "$OUT/run.log"
mkdir -p "$OUT/snap"
timeout 150 python3 -m peakmem measure --json --steps 3 --timeout 120 --out "$OUT/snap/t5_small_bf16_b8.json" \
  --snapshot /tmp/t5.pickle -- python3 benchmarks/zoo/transformers_lm.py --model t5-small --seq-len 512 \
  --precision bf16 --batch-size 8 > "$OUT/snap/t5.log" 2>&1 < /dev/null
say "t5 snapshot rc=$?"
[ -f /tmp/t5.pickle ] && python3 benchmarks/snapshots/digest.py /tmp/t5.pickle "$OUT/snap/t5_small_bf16_b8.digest.json.gz" >> "$OUT/snap/t5.log" 2>&1
tail -3 "$OUT/snap/t5.log" | tee -a "$OUT/run.log"

for x in a c b d; do eval "wait \$P$x"; say "sweep $x rc=$? rows=$(($(wc -l < "$OUT/sweeps/$x.csv" 2>/dev/null || echo 1) - 1))"; tail -2 "$OUT/sweeps/$x.out" | tee -a "$OUT/run.log"; done
kill $MON 2>/dev/null
for x in a c b d; do tail -c 40000 "/tmp/sweep_$x.log" > "$OUT/sweeps/$x.jobs.log" 2>/dev/null; done
gzip -f "$OUT/device_memory.csv"
# the device tool returns a few files per call: everything in one archive
tar czf /tmp/lease.tgz -C "$OUT" . && rm -rf "$OUT"/* && mv /tmp/lease.tgz "$OUT/lease.tgz"
say "== done"
