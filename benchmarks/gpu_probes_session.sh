#!/usr/bin/env bash
# One GPU lease for the issue-6 tables and the zoo sweep (ran on the H200, 2026-11-27): the cuDNN
# workspace grid (benchmark off) and first-use memory, then the sweep beside the grid. Usage (on the
# device machine, OUT set): bash benchmarks/gpu_probes_session.sh TOTAL_SECONDS
set -u
TOTAL=${1:-560}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
T0=$SECONDS
el() { echo $((SECONDS - T0)); }
say() { echo "[$(el)s] $*" | tee -a "$OUT/run.log"; }
mkdir -p "$OUT/c" "$OUT/f"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee -a "$OUT/run.log"
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in *H100*) G=h100-80gb ;; *H200*) G=h200 ;; *) G=$(python3 -c "import sys; sys.path.insert(0,'src'); from peakmem.measure.groundtruth import profile_name; print(profile_name('$NAME'))") ;; esac
say "profile $G"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" 2>&1 | tee -a "$OUT/run.log"
[ -f "benchmarks/groundtruth/$G.csv" ] && cp "benchmarks/groundtruth/$G.csv" "$OUT/$G.csv"
# Does NVML list this process (per-process readings survive concurrent processes)?
PIDVIS=$(python3 - <<'PY' 2>>"$OUT/run.log"
import os, torch
torch.zeros(1, device="cuda")
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print(int(any(p.pid == os.getpid() for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))))
PY
)
say "nvml sees process pids: ${PIDVIS:-?}"

say "== 1. cudnn sanity (small grid, 25 s)"
timeout 70 python3 benchmarks/cudnn_probe.py /tmp/cs --grid small --budget-s 25 --benchmark off > /tmp/cs.log 2>&1
tail -4 /tmp/cs.log | tee -a "$OUT/run.log"
OK=$(python3 -c "import csv; r=list(csv.DictReader(open('/tmp/cs/cudnn_grid.csv'))); print(sum(x['status']=='ok' for x in r))" 2>/dev/null || echo 0)
say "small grid ok rows: $OK"
python3 -c "
import csv; r=list(csv.DictReader(open('/tmp/cs/cudnn_grid.csv')))
for x in r[:12]: print(x['case_id'], x['direction'], x['backend'], x['status'], x['workspace_bytes'], x['error'][:100])
" 2>&1 | tee -a "$OUT/run.log"

say "== 2. first-use memory (GPU otherwise idle)"
timeout 100 python3 benchmarks/first_use_probe.py "$OUT/f" --budget-s 75 --isolate none > /tmp/fu.log 2>&1
say "first_use rc=$? rows=$(($(wc -l < "$OUT/f/first_use.csv" 2>/dev/null || echo 1) - 1))"
tail -3 /tmp/fu.log | tee -a "$OUT/run.log"

REM=$((TOTAL - $(el) - 25))
say "== 3. sweep + cudnn full grid (benchmark off), $REM s"
SWEEP_BUDGET=$REM
if [ "${PIDVIS:-0}" != 1 ] && [ "$OK" -gt 0 ]; then
  say "NVML hides pids: no concurrent runs; the grid first (40%), then the sweep"
  timeout $((REM * 2 / 5 + 20)) python3 benchmarks/cudnn_probe.py "$OUT/c" --grid full --budget-s $((REM * 2 / 5)) --benchmark off > /tmp/cg.log 2>&1
  say "cudnn grid rc=$? rows=$(($(zcat -f "$OUT/c/cudnn_grid.csv" 2>/dev/null | wc -l) - 1))"
  SWEEP_BUDGET=$((TOTAL - $(el) - 25))
  OK=0
fi
timeout $((SWEEP_BUDGET + 20)) python3 benchmarks/sweep.py benchmarks/sweeps/h200.toml benchmarks/sweeps/gpumemnet.toml \
  --gpu "$G" --csv "$OUT/$G.csv" --log /tmp/sweep_jobs.log --snapshot-dir /tmp/snaps --budget-seconds "$SWEEP_BUDGET" \
  > "$OUT/sweep.out" 2>&1 &
SWEEP=$!
if [ "$OK" -gt 0 ]; then
  timeout $((REM + 20)) python3 benchmarks/cudnn_probe.py "$OUT/c" --grid full --budget-s $((REM - 5)) --benchmark off > /tmp/cg.log 2>&1
  say "cudnn grid rc=$? rows=$(($(wc -l < "$OUT/c/cudnn_grid.csv" 2>/dev/null || echo 1) - 1))"
  tail -3 /tmp/cg.log | tee -a "$OUT/run.log"
fi
wait $SWEEP
say "sweep rc=$? rows=$(($(wc -l < "$OUT/$G.csv" 2>/dev/null || echo 1) - 1))"
tail -c 150000 /tmp/sweep_jobs.log >> "$OUT/sweep.out" 2>/dev/null
[ -f "$OUT/c/cudnn_grid.csv" ] && gzip -f "$OUT/c/cudnn_grid.csv"
cp /tmp/cg.log "$OUT/c/probe.log" 2>/dev/null
rm -f "$OUT/c/cudnn_grid.current"
find "$OUT" -type f | xargs ls -la | tee -a "$OUT/run.log"
say "== done"
