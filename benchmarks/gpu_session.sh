#!/usr/bin/env bash
# One GPU lease, prepared ahead: everything a CPU-only session wants measured on a real GPU, in
# order of value, each step time-boxed, results packed after every step (a cut-short run still
# returns what it measured).
#
#   bash benchmarks/gpu_session.sh OUT_DIR [BUDGET_SECONDS] [JOBS_TSV]
#
# 1. allocator snapshots of benchmarks/snapshots/record.py's jobs (replayed by
#    tests/allocator/test_real_snapshots.py once committed under tests/data/snapshots/);
# 2. each job of JOBS_TSV (lines "name<TAB>command", e.g. rebuilt public rows) under
#    `peakmem measure --steps 6 --snapshot`, the snapshot shrunk by benchmarks/snapshots/digest.py;
# 3. benchmarks/context_probe.py (context and library memory of this GPU + driver + CUDA + torch);
# 4. the bundled example under `peakmem measure`;
# 5. the zoo sweeps (smoke, then h200.toml) with the time left.
# Output: OUT_DIR/gpu_session.tgz (all of it) and OUT_DIR/summary.txt.
set -u
OUT_DIR=${1:?usage: gpu_session.sh OUT_DIR [BUDGET_SECONDS] [JOBS_TSV]}
BUDGET=${2:-400}
JOBS=${3:-.gpu/jobs.tsv}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
W=$(mktemp -d /tmp/gpu_session.XXXX)
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
pack() { tar czf "$OUT_DIR/gpu_session.tgz" -C "$W" . 2>/dev/null; }
say() { echo "[$((SECONDS - START))s] $*" | tee -a "$W/summary.txt"; }

say "== environment"
nvidia-smi > "$W/nvidia-smi.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name())" 2>&1 | tee -a "$W/summary.txt"
python3 -m pip list 2>/dev/null > "$W/pip.txt"

say "== 1. allocator snapshots"
timeout 120 python3 benchmarks/snapshots/record.py "$W/snapshots" --steps 3 >> "$W/summary.txt" 2>&1 || say "record.py failed ($?)"
pack

say "== 2. jobs under peakmem measure"
mkdir -p "$W/jobs" "$W/sweep"
while IFS=$'\t' read -r name cmd; do
  [ -z "$name" ] && continue
  if [ "$(left)" -lt 150 ]; then say "skip $name: budget"; continue; fi
  eval "set -- $cmd"
  timeout 60 python3 -m peakmem measure --json --steps 6 --timeout 50 --out "$W/jobs/$name.json" \
    --snapshot "/tmp/$name.pickle" -- "$@" > "$W/jobs/$name.log" 2>&1 < /dev/null
  rc=$?
  if [ -f "/tmp/$name.pickle" ]; then
    python3 benchmarks/snapshots/digest.py "/tmp/$name.pickle" "$W/jobs/$name.digest.json.gz" >> "$W/jobs/$name.log" 2>&1 < /dev/null
    rm -f "/tmp/$name.pickle"
  fi
  say "$name rc=$rc $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d.get('status'), 'peak', d.get('peak_bytes'), 'reserved', d.get('peak_reserved_bytes'), 'allocated', d.get('peak_allocated_bytes'), 'steps', d.get('steps'))" "$W/jobs/$name.json" 2>&1 | tail -1)"
  pack
done < "$JOBS"

say "== 3. context probe"
if [ "$(left)" -gt 120 ]; then
  timeout 90 python3 benchmarks/context_probe.py --gpu h100-80gb --out "$W/context.json" >> "$W/summary.txt" 2>&1 || say "context_probe failed ($?)"
fi
pack

say "== 4. bundled example"
timeout 60 python3 -m peakmem measure --json --out "$W/example.json" -- python3 -m peakmem.examples.mlp_train > "$W/example.log" 2>&1
say "example rc=$? $(head -c 400 "$W/example.json" 2>/dev/null)"
pack

say "== 5. zoo sweeps"
REM=$(( $(left) - 25 ))
if [ "$REM" -gt 30 ]; then
  timeout $((REM + 15)) python3 benchmarks/sweep.py benchmarks/sweeps/smoke.toml benchmarks/sweeps/h200.toml \
    --gpu h100-80gb --csv "$W/sweep/h100-80gb.csv" --budget-seconds "$REM" > "$W/sweep.out" 2>&1
  say "sweep rc=$? rows=$(($(wc -l < "$W/sweep/h100-80gb.csv" 2>/dev/null || echo 1) - 1))"
fi
pack
say "== done"
cp "$W/summary.txt" "$OUT_DIR/summary.txt"
ls -la "$OUT_DIR"
