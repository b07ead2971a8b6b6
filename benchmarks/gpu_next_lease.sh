#!/usr/bin/env bash
# The next GPU lease in one prepared call (docs/MEASURE.md "Next lease (prepared 2026-11-27)"):
# four steps in order of value, each time-boxed, everything packed into ONE archive
# $OUT/lease.tgz after every step (the device tool returns only a few files per call and empties
# $OUT between calls; a cut-short call still returns what the finished steps measured).
#   1. cuDNN workspaces of the zoo's own convolution shapes (benchmarks/data/zoo_conv_shapes.csv,
#      the --out of conv_table_coverage.py), benchmark off then on: conv/cudnn_grid.csv
#   2. first-use probes, one process per family of first_use_probe.py --isolate next
#      (the GPU must be idle: before the sweeps): first_use/first_use.csv
#   3. the NVML probe with two `peakmem measure` side by side: nvml/side_by_side.json
#   4. the rest of the sweeps, four processes side by side (as gpu_parallel_sweep.sh, every CSV
#      seeded with the committed rows so each resumes; packed every LEASE_PACK_EVERY=60 s while
#      they run): sweeps/{a,b,c,d}.csv
# plus device_memory.csv.gz (nvidia-smi, 5 Hz, the whole lease: merge_parallel_sweep.py's
# --device-log), versions.json and run.log.
# Usage (on the device machine, OUT set):
#   bash benchmarks/gpu_next_lease.sh TOTAL_SECONDS [--dry-run]
# --dry-run (no GPU): every step's plan / dry run instead of its measurement, same archive.
set -u
TOTAL=${1:-540}
DRY=0; [ "${2:-}" = "--dry-run" ] && DRY=1
: "${OUT:?set OUT to the folder that comes back}"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
W=${LEASE_WORK:-$(mktemp -d /tmp/lease.XXXXXX)}   # the work folder: $OUT holds only lease.tgz
mkdir -p "$W" "$OUT"
T0=$SECONDS
el() { echo $((SECONDS - T0)); }
left() { echo $((TOTAL - (SECONDS - T0))); }
say() { echo "[$(el)s] $*" | tee -a "$W/run.log"; }
pack() {  # the whole work folder, atomically replaced
  [ -f "$W/device_memory.csv" ] && gzip -c "$W/device_memory.csv" > "$W/device_memory.csv.gz"
  tar czf "$OUT/.lease.tgz.tmp" -C "$W" --exclude=device_memory.csv . && mv -f "$OUT/.lease.tgz.tmp" "$OUT/lease.tgz"
  say "packed $(du -k "$OUT/lease.tgz" | cut -f1) KiB: $1"
}
# seconds a step may take: its share of TOTAL, never past what is left minus the packing reserve
box() { local want=$1 rest=$(( $(left) - 25 )); [ "$want" -gt "$rest" ] && want=$rest; echo $(( want > 0 ? want : 0 )); }

SHAPES=benchmarks/data/zoo_conv_shapes.csv
G=h200
if [ $DRY = 1 ]; then
  say "dry run: no GPU steps"; echo "dry-run" > "$W/versions.json"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee -a "$W/run.log"
  NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  case "$NAME" in *H100*) G=h100-80gb ;; *H200*) G=h200 ;; *) G=$($PY -c "from peakmem.measure.groundtruth import profile_name; print(profile_name('$NAME'))") ;; esac
  nvidia-smi --query-gpu=timestamp,memory.used,memory.total --format=csv,noheader,nounits -lms 200 > "$W/device_memory.csv" 2>/dev/null &
  MON=$!
  $PY -c "import json, torch, transformers, torchvision; print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cudnn': torch.backends.cudnn.version(), 'gpu': torch.cuda.get_device_name(0), 'transformers': transformers.__version__, 'torchvision': torchvision.__version__}))" > "$W/versions.json" 2>>"$W/run.log"
fi
say "profile $G, total $TOTAL s, work folder $W"

# 1. the zoo's convolution shapes (benchmark off gets 60 %, on the rest: --on-share 0.4)
B=$(box $((TOTAL * 30 / 100)))
say "== 1. conv shapes, $B s: $(($(wc -l < $SHAPES) - 1)) rows of $SHAPES"
if [ $DRY = 1 ]; then
  $PY benchmarks/cudnn_probe.py "$W/conv" --shapes $SHAPES --dry-run >> "$W/run.log" 2>&1
else
  timeout $((B + 30)) $PY benchmarks/cudnn_probe.py "$W/conv" --shapes $SHAPES --benchmark off,on --budget-s "$B" > "$W/conv.out" 2>&1
  say "conv rc=$? rows=$(($(wc -l < "$W/conv/cudnn_grid.csv" 2>/dev/null || echo 1) - 1))"; tail -2 "$W/conv.out" | tee -a "$W/run.log"
fi
pack "conv shapes"

# 2. first-use probes, isolated processes (LAZY), no sequence run
B=$(box $((TOTAL * 25 / 100)))
say "== 2. first use, $B s"
if [ $DRY = 1 ]; then
  $PY benchmarks/first_use_probe.py "$W/first_use" --modes "" --isolate next --dry-run >> "$W/run.log" 2>&1
else
  timeout $((B + 20)) $PY benchmarks/first_use_probe.py "$W/first_use" --modes "" --isolate next --budget-s "$B" > "$W/first_use.out" 2>&1
  say "first use rc=$?"; tail -3 "$W/first_use.out" | tee -a "$W/run.log"
fi
pack "first use"

# 3. the NVML probe, two measure processes side by side
say "== 3. nvml side by side"
if [ $DRY = 1 ]; then
  mkdir -p "$W/nvml"; echo '{"ok": null, "dry_run": true}' > "$W/nvml/side_by_side.json"
else
  NB=$(box 60)
  if [ "$NB" -ge 20 ]; then  # timeout 0 would mean no limit
    timeout "$NB" $PY benchmarks/nvml_side_by_side.py "$W/nvml" --gib 1,8 > "$W/nvml.out" 2>&1
    say "nvml check rc=$?"; tail -1 "$W/nvml.out" | tee -a "$W/run.log"
  else
    say "no time left for the nvml check"
  fi
fi
pack "nvml"

# 4. the sweeps with what is left: the zoo in order and in reverse group order, GPUMemNet both
$PY - <<'PY'
import pathlib
for name in ["h200", "gpumemnet"]:
    text = pathlib.Path(f"benchmarks/sweeps/{name}.toml").read_text()
    head, *groups = text.split("\n[[")  # [[group]] and [[run]] tables, each with what follows it
    pathlib.Path(f"/tmp/{name}_rev.toml").write_text(head + "".join("\n[[" + g.rstrip("\n") + "\n" for g in reversed(groups)))
PY
mkdir -p "$W/sweeps"
SB=$(box $(( $(left) - 45 )))
say "== 4. sweeps, $SB s each"
if [ $DRY = 1 ]; then
  $PY benchmarks/sweep.py benchmarks/sweeps/h200.toml benchmarks/sweeps/gpumemnet.toml --plan --gpu "$G" \
    --csv "benchmarks/groundtruth/$G.csv" > "$W/sweeps/plan.txt" 2>&1
  say "sweep plan rc=$?"
elif [ "$SB" -ge 60 ]; then
  P=""
  for spec in "a benchmarks/sweeps/h200.toml" "c /tmp/h200_rev.toml" "b benchmarks/sweeps/gpumemnet.toml" "d /tmp/gpumemnet_rev.toml"; do
    set -- $spec
    [ -f "benchmarks/groundtruth/$G.csv" ] && cp "benchmarks/groundtruth/$G.csv" "$W/sweeps/$1.csv"
    timeout $((SB + 30)) $PY benchmarks/sweep.py "$2" --gpu "$G" --csv "$W/sweeps/$1.csv" --log "/tmp/sweep_$1.log" --snapshot-dir /tmp/snaps \
      --budget-seconds "$SB" > "$W/sweeps/$1.out" 2>&1 < /dev/null &
    P="$P $!"
  done
  # a call cut short keeps the rows so far; the trap ends the sleep too (no orphan holding stdout)
  ( trap 'kill $S 2>/dev/null; exit 0' TERM; while true; do sleep "${LEASE_PACK_EVERY:-60}" & S=$!; wait $S; pack "sweeps running"; done ) &
  PACKER=$!
  for p in $P; do wait "$p"; done
  kill "$PACKER" 2>/dev/null; wait "$PACKER" 2>/dev/null
  for x in a c b d; do
    say "sweep $x rows=$(($(wc -l < "$W/sweeps/$x.csv" 2>/dev/null || echo 1) - 1))"; tail -1 "$W/sweeps/$x.out" | tee -a "$W/run.log"
    tail -c 40000 "/tmp/sweep_$x.log" > "$W/sweeps/$x.jobs.log" 2>/dev/null
  done
else
  say "no time left for the sweeps"
fi
[ -n "${MON:-}" ] && kill "$MON" 2>/dev/null
say "== done"
pack "done"
