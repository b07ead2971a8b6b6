"""Speed of peakmem: every figure of issue 14's targets, measured side by side in one run.

    python benchmarks/estimate_speed.py [--only gpt2,rows,llama,allocator] [--rows 15] [--json]
                                        [--sets mlp1,mlp2,cnn,transformer]

Prints one JSON line per figure, then a summary table:

- `gpt2`: `peakmem estimate` of GPT-2 small (`benchmarks/zoo/transformers_lm.py`, batch 4 x 512,
  AdamW, fp32) end to end (the job in its supervised child process, as the CLI runs it), and ONE
  real CPU training iteration of the same model in this process (model built, the first
  iteration, which also allocates the optimizer state, excluded). Target: ratio <= 1/20. Three
  estimates: cold (a fresh job process), warm (`peakmem warm`: the job's process forked from a
  warm one with torch imported) and warm with GPT-2's module preloaded (`peakmem warm --preload
  transformers.models.gpt2.modeling_gpt2`); each warm process runs in a private runtime
  directory of its own, started before its estimate (its start-up is reported apart). Warm,
  the CPU time adds the job's child, a child of the warm process (its waited-for children's
  CPU in /proc). `cpu_ratio`: estimate CPU seconds / the real iteration's CPU seconds (steadier
  than wall seconds on a shared machine).
- `rows`: median seconds per estimate of GPUMemNet rows as `peakmem bench` makes them (in one
  worker process, one after the other): `--rows` rows spread over each set (the 17 transformer
  rows all), MLP (step 1 and 2), CNN, transformer. Targets: transformer <= 2 s, MLP and CNN
  <= 0.5 s. The held-out CNN set (1634 rows) on 2 cores is extrapolated from the CNN sample:
  mean seconds per row x rows / 2 workers (target <= 3 min).
- `llama`: Llama-3-8B shape, bf16 weights, AdamW, batch 1 x 2048, end to end. Target <= 10 s.
- `allocator`: replaying 1 million events (`allocator_speed.py`'s trace), best of 3. Target
  <= 2 s.

Each figure has its wall time and this process's CPU time (children included where the job runs
in a child): on a shared machine the CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ZOO = HERE / "zoo"
DATA = HERE.parents[1] / "shared" / "datasets"
if not DATA.is_dir():
    DATA = Path("/work/shared/datasets")
HELD_OUT_CNN_ROWS = 1634
BENCH_WORKERS = 2


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@contextlib.contextmanager
def _timed(out: dict):
    wall, cpu = time.perf_counter(), _cpu()
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
    out["seconds"] = round(time.perf_counter() - wall, 3)
    out["cpu_seconds"] = round(_cpu() - cpu, 3)


def real_iteration_seconds(model_name: str, batch: int, seq: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one real CPU training iteration (the second one)."""
    import torch

    from peakmem.capture import vision_ops

    # transformers imports torchvision when it is installed; its compiled ops cannot load next
    # to a CPU-only torch (peakmem declares their schemas, as a capture does)
    vision_ops.declare_torchvision_ops()
    sys.path.insert(0, str(ZOO))
    import transformers_lm  # noqa: PLC0415

    args = argparse.Namespace(model=model_name, num_layers=None, hidden_size=None, num_heads=None,
                              intermediate_size=None, vocab_size=None, attn="sdpa",
                              weights_dtype="fp32")
    model = transformers_lm.build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    times = []
    for _ in range(2):  # the first iteration also allocates the optimizer state
        start, cpu = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times[-1]


GPT2_COMMAND = ["python", str(ZOO / "transformers_lm.py"), "--model", "gpt2", "--optimizer",
                "adamw", "--batch-size", "4", "--seq-len", "512"]
GPT2_MODULE = "transformers.models.gpt2.modeling_gpt2"


def _waited_children_cpu(pid: int) -> float:
    """CPU seconds of the waited-for children of process `pid` (/proc: cutime + cstime)."""
    with open(f"/proc/{pid}/stat", "rb") as handle:
        fields = handle.read().rsplit(b")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _estimate_gpt2(figure: dict, warm: str) -> None:
    """`peakmem estimate` of GPT-2 small as the CLI runs it, `warm`: "0" cold, "1" warm. Warm,
    the CPU seconds include the job's child (a child of the warm process, which waits for it)."""
    from peakmem.estimate import estimate_command
    from peakmem.jobs import zygote_client

    previous = os.environ.get("PEAKMEM_WARM")
    os.environ["PEAKMEM_WARM"] = warm
    zygote = (zygote_client.status() or {}).get("pid") if warm == "1" else None
    try:
        before = _waited_children_cpu(zygote) if zygote else 0.0
        with _timed(figure):
            result = estimate_command(GPT2_COMMAND, gpu="h100-80gb")
        if zygote:
            figure["cpu_seconds"] = round(
                figure["cpu_seconds"] + _waited_children_cpu(zygote) - before, 3)
    finally:
        if previous is None:
            del os.environ["PEAKMEM_WARM"]
        else:
            os.environ["PEAKMEM_WARM"] = previous
    figure["steps"] = result.steps
    figure["peak_bytes"] = result.peak_bytes
    figure["ran_warm"] = any("warm job process (peakmem warm)" in n for n in result.notes)


@contextlib.contextmanager
def _warm_process(preload: list[str]):
    """A warm job process (`peakmem warm`) in a private runtime directory of its own; its
    start-up seconds."""
    import tempfile

    from peakmem.jobs import zygote_client

    previous = os.environ.get("PEAKMEM_RUNTIME_DIR")
    with tempfile.TemporaryDirectory(prefix="peakmem-speed-") as directory:
        os.environ["PEAKMEM_RUNTIME_DIR"] = directory
        try:
            start = time.perf_counter()
            zygote_client.start(preload, idle_seconds=600)
            yield round(time.perf_counter() - start, 3)
        finally:
            zygote_client.stop()
            if previous is None:
                del os.environ["PEAKMEM_RUNTIME_DIR"]
            else:
                os.environ["PEAKMEM_RUNTIME_DIR"] = previous


def gpt2(args) -> list[dict]:
    """Cold (a fresh job process, as without `peakmem warm`), warm (forked from a warm process
    with torch imported) and warm with GPT-2's module preloaded, each against ONE real CPU
    iteration measured in the same run. The warm process's own start-up is reported apart
    (paid once, before any estimate)."""
    figures = []
    cold: dict = {"figure": "gpt2_small_4x512_adamw", "job": " ".join(GPT2_COMMAND[1:]),
                  "start": "cold"}
    _estimate_gpt2(cold, "0")
    figures.append(cold)
    for name, preload in (("gpt2_small_4x512_adamw_warm", []),
                          ("gpt2_small_4x512_adamw_warm_preloaded", [GPT2_MODULE])):
        figure: dict = {"figure": name, "job": " ".join(GPT2_COMMAND[1:]),
                        "start": "warm" + (f" --preload {preload[0]}" if preload else "")}
        with _warm_process(preload) as startup:
            figure["warm_process_start_seconds"] = startup
            _estimate_gpt2(figure, "1")
        figure["same_estimate_as_cold"] = figure["peak_bytes"] == cold["peak_bytes"]
        figures.append(figure)
    wall, cpu = real_iteration_seconds("gpt2", 4, 512)
    for figure in figures:
        figure["real_cpu_iteration_seconds"] = round(wall, 3)
        figure["real_cpu_iteration_cpu_seconds"] = round(cpu, 3)
        figure["ratio"] = round(figure["seconds"] / wall, 4)
        figure["cpu_ratio"] = round(figure["cpu_seconds"] / cpu, 4)
        figure["target"] = "ratio <= 0.05"
    return figures


def rows(args) -> list[dict]:
    from peakmem.baselines.peakmem_estimator import PeakmemEstimator
    from peakmem.bench.calibration import evaluation_rows
    from peakmem.datasets.loaders import load_rows, spread_subset

    estimator = PeakmemEstimator()
    figures = []
    for name, targets in (
        ("gpumemnet-mlp1", 0.5), ("gpumemnet-mlp2", 0.5), ("gpumemnet-cnn", 0.5),
        ("gpumemnet-transformer", 2.0),
    ):
        if args.sets and not any(part in name for part in args.sets.split(",")):
            continue
        all_rows = evaluation_rows(load_rows(name, DATA))
        sample = spread_subset(all_rows, args.rows if "transformer" not in name else None)
        seconds, cpu, errors = [], [], []
        for row in sample:
            figure: dict = {}
            with _timed(figure):
                try:
                    estimator.estimate(row)
                except Exception as exc:  # noqa: BLE001 - counted, and it still took time
                    errors.append(f"{row.id}: {type(exc).__name__}: {exc}"[:300])
            seconds.append(figure["seconds"])
            cpu.append(figure["cpu_seconds"])
        out = {
            "figure": f"{name}_median_seconds",
            "rows": len(sample),
            "errors": errors,
            "median_seconds": round(statistics.median(seconds), 3),
            "median_cpu_seconds": round(statistics.median(cpu), 3),
            "mean_seconds": round(statistics.fmean(seconds), 3),
            "target": f"median <= {targets} s",
        }
        figures.append(out)
        if name == "gpumemnet-cnn":
            mean_cpu = statistics.fmean(cpu)
            figures.append({
                "figure": "gpumemnet_cnn_held_out_set_seconds",
                "rows": HELD_OUT_CNN_ROWS,
                "extrapolated_from_rows": len(sample),
                "seconds": round(statistics.fmean(seconds) * HELD_OUT_CNN_ROWS / BENCH_WORKERS, 1),
                "cpu_seconds_per_core": round(mean_cpu * HELD_OUT_CNN_ROWS / BENCH_WORKERS, 1),
                "target": "<= 180 s on 2 cores",
            })
    return figures


def llama(args) -> dict:
    from peakmem.estimate import estimate_command

    command = ["python", str(ZOO / "transformers_lm.py"), "--model", "llama-8b",
               "--weights-dtype", "bf16", "--optimizer", "adamw", "--batch-size", "1",
               "--seq-len", "2048"]
    figure: dict = {"figure": "llama3_8b_bf16_adamw_1x2048", "job": " ".join(command[1:])}
    with _timed(figure):
        result = estimate_command(command, gpu="h100-80gb")
    figure["peak_bytes"] = result.peak_bytes
    figure["target"] = "<= 10 s"
    return figure


def allocator(args) -> dict:
    sys.path.insert(0, str(HERE))
    from allocator_speed import training_like_trace  # noqa: PLC0415

    from peakmem.allocator import simulate

    trace = training_like_trace(1_000_000)
    walls, cpus = [], []
    for _ in range(3):
        wall, cpu = time.perf_counter(), time.process_time()
        result = simulate(trace, "", capacity_bytes=80 * 1024**3)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return {"figure": "allocator_1m_events", "events": len(trace),
            "seconds": round(min(walls), 3), "cpu_seconds": round(min(cpus), 3),
            "peak_reserved_bytes": result.peak_reserved_bytes, "target": "<= 2 s"}


FIGURES = {"gpt2": gpt2, "rows": rows, "llama": llama, "allocator": allocator}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(FIGURES),
                        help=f"comma-separated, of: {', '.join(FIGURES)}")
    parser.add_argument("--rows", type=int, default=15, help="rows per MLP / CNN set")
    parser.add_argument("--sets", default="",
                        help="`rows`: only the sets whose name holds one of these "
                             "(comma-separated: mlp1,mlp2,cnn,transformer; default all)")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = []
    for name in args.only.split(","):
        out = FIGURES[name.strip()](args)
        for figure in out if isinstance(out, list) else [out]:
            results.append(figure)
            print(json.dumps(figure), flush=True)
    print()
    print("| figure | measured | CPU | target |")
    print("| --- | --- | --- | --- |")
    for figure in results:
        if "ratio" in figure:
            measured = (f"{figure['seconds']} s vs {figure['real_cpu_iteration_seconds']} s: "
                        f"ratio {figure['ratio']}")
            cpu = (f"{figure['cpu_seconds']} s vs {figure['real_cpu_iteration_cpu_seconds']} s: "
                   f"ratio {figure['cpu_ratio']}")
        elif "median_seconds" in figure:
            measured = f"median {figure['median_seconds']} s ({figure['rows']} rows)"
            cpu = f"median {figure['median_cpu_seconds']} s"
        elif "cpu_seconds_per_core" in figure:
            measured = (f"{figure['seconds']} s (extrapolated from {figure['extrapolated_from_rows']}"
                        " rows)")
            cpu = f"{figure['cpu_seconds_per_core']} s per core"
        else:
            measured, cpu = f"{figure['seconds']} s", f"{figure['cpu_seconds']} s"
        print(f"| {figure['figure']} | {measured} | {cpu} | {figure['target']} |")


if __name__ == "__main__":
    main()
