"""The same GPUMemNet jobs on two GPUs (issue 4): the public GPUMemNet configurations (A100-40GB,
torch 2.4.1, ../shared/datasets/gpumemnet) that benchmarks/sweeps/gpumemnet.toml re-ran on our
H200 (torch 2.11.0+cu130; benchmarks/groundtruth/h200.csv, `config` = the public row's Filename
without .out), side by side: measured peak, peak minus the memory outside the allocator, and
peakmem's estimate of each.

    PYTHONPATH=src python benchmarks/gpumemnet_across_gpus.py [--data ../shared/datasets]
        [--out R.json] [--reuse R.json] [--limit N]

The A100 figure is nvidia-smi's device-level `memory.used` maximum (1 Hz; README of the set); it
has no context column, so its "peak - outside" subtracts our model of the memory outside the
allocator on that stack (context + libraries of the A100 estimate), marked "model". The H200's
is NVML's per-process peak less the run's own measured `context_bytes` (= its max reserved).
Estimating the pairs takes ~15 s a job on a shared core; `--out` keeps the figures and `--reuse`
prints them again without estimating.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

from peakmem.baselines.base import CannotEstimate
from peakmem.baselines.peakmem_estimator import PeakmemEstimator
from peakmem.bench.calibration import in_calibration_split
from peakmem.datasets.loaders import load_rows
from peakmem.datasets.rows import MiB
from peakmem.estimate.first_use import first_use_bytes
from peakmem.profiles import load_gpu, load_stack

PUBLIC_SETS = ("gpumemnet-mlp1", "gpumemnet-mlp2", "gpumemnet-cnn", "gpumemnet-transformer")
OURS = ("h200", "h100-80gb")
TRANSFORMER_KEYS = {"embedding_size": "E", "num_layers": "L", "seq_length": "S", "batch_size": "B"}


def public_by_config(data: str | None) -> dict[str, object]:
    """Filename (without .out) -> the public A100 row (the first set holding it)."""
    found: dict[str, object] = {}
    for name in PUBLIC_SETS:
        for row in load_rows(name, data):
            config = str(row.features["Filename"]).removesuffix(".out")
            found.setdefault(config, row)
    return found


def remeasured(gpu: str) -> dict[str, object]:
    """config -> our ok run of it on `gpu` (benchmarks/groundtruth/<gpu>.csv, gpumemnet.py)."""
    return {
        str(r.features["config"]): r
        for r in load_rows("groundtruth")
        if r.gpu == gpu and r.job["job"].endswith("gpumemnet.py") and r.status == "ok"
        and r.features.get("config")
    }


def estimated(row) -> dict:
    try:
        result = PeakmemEstimator().run(row)
    except CannotEstimate as exc:
        return {"error": str(exc)}
    return {
        "peak": int(result.peak_bytes),
        "reserved": int(result.peak_reserved_bytes),
        "outside": int(result.context_bytes + result.library_bytes),
    }


def collect(data: str | None, limit: int | None) -> dict[str, dict]:
    public = public_by_config(data)
    ours = {gpu: remeasured(gpu) for gpu in OURS}
    configs = sorted(c for c in ours["h200"] if c in public)[:limit]
    missing = sorted(c for c in ours["h200"] if c not in public)
    if missing:
        print(f"not in the public sets: {missing}", file=sys.stderr)
    out: dict[str, dict] = {}
    for config in configs:
        a100, h200 = public[config], ours["h200"][config]
        entry = {
            "family": a100.family,
            "a100_split": in_calibration_split(a100),
            "a100": {"measured": int(a100.measured_peak_bytes), "status": a100.status,
                     "estimate": estimated(a100)},
            "h200": {"measured": int(h200.features["measured_peak_bytes"]),
                     "reserved": int(h200.features["max_reserved_bytes"]),
                     "context": int(h200.features["context_bytes"]),
                     "estimate": estimated(h200)},
        }
        if config in ours["h100-80gb"]:
            h100 = ours["h100-80gb"][config]
            entry["h100"] = {"measured": int(h100.features["measured_peak_bytes"]),
                             "context": int(h100.features["context_bytes"])}
        out[config] = entry
        print(f"estimated {config}", file=sys.stderr, flush=True)
    return out


def mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MiB:.0f}"


def short(config: str) -> str:
    if config.startswith("num_classes"):  # Transformer: embedding, layers, sequence, batch
        found = {key: re.search(rf"{key}:(\d+)", config) for key in TRANSFORMER_KEYS}
        return "tf " + " ".join(f"{TRANSFORMER_KEYS[k]}{m.group(1) if m else '?'}"
                                for k, m in found.items())
    parts = dict(p.split(":", 1) for p in config.split("_") if ":" in p)
    extra = ""
    if "act" in parts:
        extra = f" {parts['act']}{' bn' if parts.get('batchnorm') == 'True' else ''}"
        extra += " do" if parts.get("dropout") == "True" else ""
    return (f"mlp {parts.get('input')}-{parts.get('output')} d{parts.get('depth')} "
            f"{parts.get('arch')} b{parts.get('batch')}{extra}")


def table(results: dict[str, dict]) -> list[str]:
    head = ("| job | A100 peak | A100 est | A100 peak - outside (model) | H200 peak | H200 est |"
            " H200 peak - context | H200 - A100 peak | H200 - A100 (less outside) |")
    lines = [head, "|" + "---|" * 9]
    moves, inner = [], []
    for config, e in sorted(results.items(), key=lambda kv: kv[1]["h200"]["measured"]):
        a, h = e["a100"], e["h200"]
        a_est, h_est = a["estimate"], h["estimate"]
        a_inner = a["measured"] - a_est["outside"] if "outside" in a_est else None
        h_inner = h["measured"] - h["context"]
        moves.append(h["measured"] - a["measured"])
        if a_inner is not None:
            inner.append(h_inner - a_inner)
        lines.append(
            f"| {short(config)}{' (A100 split)' if e.get('a100_split') else ''} | {mib(a['measured'])} | {mib(a_est.get('peak'))} |"
            f" {mib(a_inner)} | {mib(h['measured'])} | {mib(h_est.get('peak'))} | {mib(h_inner)} |"
            f" {(h['measured'] - a['measured']) / MiB:+.0f} |"
            f" {'-' if a_inner is None else f'{(h_inner - a_inner) / MiB:+.0f}'} |"
        )
    lines.append("")
    reserved = [e["h200"]["estimate"]["reserved"] - e["a100"]["estimate"]["reserved"]
                for e in results.values() if "reserved" in e["a100"]["estimate"]
                and "reserved" in e["h200"]["estimate"]]
    lines.append(f"{len(results)} configurations; H200 - A100 measured peak: median "
                 f"{statistics.median(moves) / MiB:+.0f} MiB, range {min(moves) / MiB:+.0f} to "
                 f"{max(moves) / MiB:+.0f} MiB; less the memory outside the allocator: median "
                 f"{statistics.median(inner) / MiB:+.0f} MiB, range {min(inner) / MiB:+.0f} to "
                 f"{max(inner) / MiB:+.0f} MiB; estimated peak reserved H200 - A100: median "
                 f"{statistics.median(reserved) / MiB:+.0f} MiB, range {min(reserved) / MiB:+.0f} "
                 f"to {max(reserved) / MiB:+.0f} MiB")
    for gpu in ("a100", "h200"):
        errors = [e[gpu]["estimate"]["peak"] - e[gpu]["measured"] for e in results.values()
                  if "peak" in e[gpu]["estimate"]]
        if errors:
            lines.append(f"{gpu} estimate - measured peak: median {statistics.median(errors) / MiB:+.0f}"
                         f" MiB, range {min(errors) / MiB:+.0f} to {max(errors) / MiB:+.0f} MiB,"
                         f" within 2 MiB {sum(abs(x) <= 2 * MiB for x in errors)}/{len(errors)}")
    h100 = [(e["h100"]["measured"] - e["h200"]["measured"]) for e in results.values() if "h100" in e]
    if h100:
        lines.append(f"also on our H100 (2026-11-26): {len(h100)} of them, H100 - H200 measured "
                     f"peak {sorted({x / MiB for x in h100})} MiB")
    return lines


def stack_facts() -> list[str]:
    """What the two stacks put outside the job's own tensors (the profiles' figures)."""
    lines = []
    for gpu_name, version in (("a100-40gb", "2.4.1"), ("h200", "2.11.0")):
        gpu, stack = load_gpu(gpu_name), load_stack(version)
        lt = stack.cublaslt_workspace
        gemm = first_use_bytes(stack, gpu, ("mm", "addmm"))  # the first-use model, where measured
        first_use = (" + first use of an fp32 MLP " + " + ".join(
            f"{name} {value / MiB:.0f} MiB" for name, value in gemm.items())) if gemm else ""
        lines.append(
            f"{gpu_name} (sm_{gpu.capability[0]}{gpu.capability[1]}), torch {version}: context "
            f"{stack.context_for(gpu).value / MiB:.0f} MiB{first_use}, cuBLAS workspace per handle "
            f"{stack.cublas_workspace_for(gpu.capability).value / MiB:.3f} MiB, cuBLASLt workspace "
            f"{'none' if lt is None else f'{int(lt.value) / MiB:.3f} MiB'}, cuDNN convolution "
            f"library {stack.library_bytes_for(gpu, 'cudnn_convolution').value / MiB:.0f} MiB"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="the public datasets' directory")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--reuse", type=Path, default=None)
    args = parser.parse_args()
    results = (json.loads(args.reuse.read_text()) if args.reuse
               else collect(args.data, args.limit))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True))
    for line in (*table(results), "", *stack_facts()):
        print(line)


if __name__ == "__main__":
    main()
