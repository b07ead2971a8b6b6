"""Benchmark datasets as loaders yielding `BenchRow`s (one registry: name -> loader).

The public sets live outside the repo (they are not ours to redistribute): by default in
`../shared/datasets/` relative to the repository root, or wherever `--data` points. This repo's
own ground truth lives in `benchmarks/groundtruth/*.csv` of the repository itself.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from peakmem.bench.gpumemnet_jobs import JobParseError, parse_cnn, parse_mlp, parse_transformer
from peakmem.bench.rows import GPU_TOTAL_BYTES, BenchRow, MiB

REPO_ROOT = Path(__file__).resolve().parents[3]
GROUNDTRUTH_DIR = REPO_ROOT / "benchmarks" / "groundtruth"
GROUNDTRUTH_COLUMNS = (
    "job",
    "args",
    "gpu",
    "torch",
    "cuda",
    "driver",
    "measured_peak_bytes",
    "max_reserved_bytes",
    "max_allocated_bytes",
    "context_bytes",
    "status",
    "seconds",
)

GPUMEMNET_GPU = "a100-40gb"
GPUMEMNET_TORCH = "2.4.1"
XMEM_TORCH = "2.6.0"


class DatasetUnavailable(RuntimeError):
    """The dataset's files are not where the loader looks (one-line message for the user)."""


def default_data_dir() -> Path | None:
    """`../shared/datasets/` next to the repository root, when it exists."""
    candidate = REPO_ROOT.parent / "shared" / "datasets"
    return candidate if candidate.is_dir() else None


def resolve_data_dir(data_dir: str | Path | None) -> Path:
    if data_dir is not None:
        path = Path(data_dir)
        if not path.is_dir():
            raise DatasetUnavailable(f"data directory {path} does not exist")
        return path
    default = default_data_dir()
    if default is None:
        raise DatasetUnavailable(
            f"no data directory: pass --data DIR (looked for {REPO_ROOT.parent / 'shared/datasets'})"
        )
    return default


def _csv_rows(path: Path) -> Iterator[dict[str, str]]:
    if not path.is_file():
        raise DatasetUnavailable(f"missing dataset file {path}")
    with path.open(newline="") as fh:
        yield from csv.DictReader(fh)


def _gpumemnet_status(row: dict[str, str]) -> str:
    return "oom" if row.get("Status", "SUCCESSFUL") == "OOM_CRASH" else "ok"


def _gpumemnet_row(dataset: str, index: int, family: str, job: object, raw: dict[str, str]):
    return BenchRow(
        id=f"{index:05d}",
        dataset=dataset,
        family=family,
        job=job,
        measured_peak_bytes=int(float(raw["Max GPU Memory (MiB)"]) * MiB),
        status=_gpumemnet_status(raw),  # type: ignore[arg-type]
        gpu=GPUMEMNET_GPU,
        torch_version=GPUMEMNET_TORCH,
        gpu_total_bytes=GPU_TOTAL_BYTES[GPUMEMNET_GPU],
        features={k: v for k, v in raw.items() if k != "Activations-Params"},
    )


def _load_mlp(
    dataset: str, filename: str, skip_single_output: bool
) -> Callable[[Path], Iterator[BenchRow]]:
    def load(data_dir: Path) -> Iterator[BenchRow]:
        for index, raw in enumerate(_csv_rows(data_dir / "gpumemnet" / filename)):
            job = parse_mlp(raw["Filename"])
            if skip_single_output and job.output_size == 1:
                continue  # step 1: crashed at the loss (README), not a memory measurement
            yield _gpumemnet_row(dataset, index, f"mlp-{job.arch}", job, raw)

    return load


def load_gpumemnet_cnn(data_dir: Path) -> Iterator[BenchRow]:
    """cnn_data_step1_prefix.csv, then the cnn_data_sample14.csv rows not already in it.

    Rows with memory 0 are failed runs (README): skipped.
    """
    seen: set[str] = set()
    index = 0
    for name in ("cnn_data_step1_prefix.csv", "cnn_data_sample14.csv"):
        for raw in _csv_rows(data_dir / "gpumemnet" / name):
            filename = raw["Filename"]
            if filename in seen:
                continue
            seen.add(filename)
            this_index = index
            index += 1
            if float(raw["Max GPU Memory (MiB)"]) <= 0:
                continue
            try:
                job = parse_cnn(filename, raw.get("Activations-Params") or None)
            except JobParseError:
                job = parse_cnn(filename)  # layer list unusable: dense cannot be rebuilt
            yield _gpumemnet_row("gpumemnet-cnn", this_index, f"cnn-{job.arch}", job, raw)


def load_gpumemnet_transformer(data_dir: Path) -> Iterator[BenchRow]:
    name = "transformer_data_sample17.csv"
    for index, raw in enumerate(_csv_rows(data_dir / "gpumemnet" / name)):
        job = parse_transformer(raw["Filename"])
        yield _gpumemnet_row("gpumemnet-transformer", index, "transformer", job, raw)


def _timm_family(model: str) -> str:
    match = re.match(r"[a-z]+", model)
    return match.group(0) if match else model


def timm_status(raw: dict[str, str], gpu_total_bytes: int) -> str:
    """The set has no status column. A row whose published naive FakeTensor peak (the tensors
    live over forward + backward: a lower bound of what the job allocates) exceeds the GPU cannot
    have run: its measured number is where an out-of-memory stopped it, so it is an OOM row."""
    lower_bound = raw.get("faketensor_mib")
    if lower_bound and float(lower_bound) * MiB > gpu_total_bytes:
        return "oom"
    return "ok"


def load_timm(data_dir: Path) -> Iterator[BenchRow]:
    """timm models x batch sizes on the A100-40GB (torch 2.4.1 assumed, as the rest of the set)."""
    total = GPU_TOTAL_BYTES[GPUMEMNET_GPU]
    for index, raw in enumerate(_csv_rows(data_dir / "gpumemnet" / "timm_measured.csv")):
        yield BenchRow(
            id=f"{index:05d}",
            dataset="timm",
            family=_timm_family(raw["model"]),
            job={"library": "timm", "model": raw["model"], "batch_size": int(raw["batch_size"])},
            measured_peak_bytes=int(float(raw["measured_mib"]) * MiB),
            status=timm_status(raw, total),
            gpu=GPUMEMNET_GPU,
            torch_version=GPUMEMNET_TORCH,
            gpu_total_bytes=total,
            features=dict(raw),
        )


_XMEM_GPUS = {
    "NVIDIA GeForce RTX 3060": "rtx3060-12gb",
    "NVIDIA GeForce RTX 4060": "rtx4060-8gb",
    "NVIDIA A100-SXM4-40GB": "a100-40gb",
}


def load_xmem(data_dir: Path) -> Iterator[BenchRow]:
    """One row per xMem run (the CSV has one line per run x estimator); the published estimates
    are kept in `features` as `published:<estimator>` (MiB, blank when it failed)."""
    runs: dict[str, dict[str, str]] = {}
    order: list[str] = []
    for raw in _csv_rows(data_dir / "xmem" / "xmem_runs.csv"):
        run = runs.get(raw["run_dir"])
        if run is None:
            run = runs[raw["run_dir"]] = dict(raw)
            order.append(raw["run_dir"])
        run[f"published:{raw['estimator']}"] = raw["estimate_mib"]
    for index, key in enumerate(order):
        raw = runs[key]
        gpu = _XMEM_GPUS.get(raw["gpu_name"], raw["gpu_name"].lower().replace(" ", "-"))
        yield BenchRow(
            id=f"{index:05d}",
            dataset="xmem",
            family=raw["model"],
            job={
                "library": "torchvision/transformers",
                "model": raw["model"],
                "batch_size": int(raw["batch_size"]),
                "optimizer": raw["optimizer"],
            },
            measured_peak_bytes=int(float(raw["measured_peak_mib"]) * MiB),
            status="oom" if raw["real_oom"] == "True" else "ok",
            gpu=gpu,
            torch_version=XMEM_TORCH,
            gpu_total_bytes=int(float(raw["gpu_total_mib"]) * MiB),
            features=raw,
            # xMem's ground truth is max(NVML used - used at the first sample); the first sample
            # is taken after `torch.cuda.set_per_process_memory_fraction` created the context
            # (exp/trainer/__init__.py FastRunner.train_on_gpu, exp/run.py _get_ground_truth).
            measured_includes_context=False,
        )


_GROUNDTRUTH_STATUS = {"ok": "ok", "oom": "oom"}


def load_groundtruth(
    _data_dir: Path | None, directory: Path = GROUNDTRUTH_DIR
) -> Iterator[BenchRow]:
    """This repo's own measurements (`peakmem measure`); rows with another status are skipped."""
    files = sorted(directory.glob("*.csv")) if directory.is_dir() else []
    if not files:
        raise DatasetUnavailable(
            f"no ground truth yet: {directory} has no *.csv (run `peakmem measure` on a GPU)"
        )
    for path in files:
        for index, raw in enumerate(_csv_rows(path)):
            missing = [c for c in GROUNDTRUTH_COLUMNS if c not in raw]
            if missing:
                raise DatasetUnavailable(f"{path}: missing columns {', '.join(missing)}")
            status = _GROUNDTRUTH_STATUS.get(raw["status"].strip().lower())
            if status is None or not raw["measured_peak_bytes"]:
                continue
            gpu = raw["gpu"]
            yield BenchRow(
                id=f"{path.stem}:{index:05d}",
                dataset="groundtruth",
                family=raw["job"].split(":")[0].split("/")[-1].removesuffix(".py"),
                job={"job": raw["job"], "args": raw["args"]},
                measured_peak_bytes=int(raw["measured_peak_bytes"]),
                status=status,  # type: ignore[arg-type]
                gpu=gpu,
                torch_version=raw["torch"],
                gpu_total_bytes=GPU_TOTAL_BYTES.get(gpu, 0),
                features=dict(raw),
            )


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    load: Callable[[Path], Iterator[BenchRow]]
    needs_data_dir: bool = True


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        DatasetSpec(
            "gpumemnet-mlp1",
            "GPUMemNet MLPs, step 1 (ReLU), A100-40GB",
            _load_mlp("gpumemnet-mlp1", "mlp_data_step1.csv", skip_single_output=True),
        ),
        DatasetSpec(
            "gpumemnet-mlp2",
            "GPUMemNet MLPs, step 2 (activations, BN, dropout), A100-40GB",
            _load_mlp("gpumemnet-mlp2", "mlp_data_step2.csv", skip_single_output=False),
        ),
        DatasetSpec("gpumemnet-cnn", "GPUMemNet CNNs (7 archs), A100-40GB", load_gpumemnet_cnn),
        DatasetSpec(
            "gpumemnet-transformer",
            "GPUMemNet Transformer encoders, A100-40GB",
            load_gpumemnet_transformer,
        ),
        DatasetSpec("timm", "timm models x 5 batch sizes, A100-40GB (needs timm)", load_timm),
        DatasetSpec("xmem", "xMem's own evaluation runs (RTX 3060/4060, A100)", load_xmem),
        DatasetSpec(
            "groundtruth",
            "this repo's measurements, benchmarks/groundtruth/*.csv",
            load_groundtruth,
            needs_data_dir=False,
        ),
    )
}


def load_rows(name: str, data_dir: str | Path | None = None) -> list[BenchRow]:
    """All rows of dataset `name`; DatasetUnavailable / KeyError carry a one-line message."""
    spec = DATASETS.get(name)
    if spec is None:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    directory = resolve_data_dir(data_dir) if spec.needs_data_dir else None
    return list(spec.load(directory))  # type: ignore[arg-type]


def spread_subset(rows: list[BenchRow], limit: int | None) -> list[BenchRow]:
    """At most `limit` rows, evenly spaced over the set (not just its head), order kept."""
    if limit is None or limit >= len(rows):
        return rows
    if limit <= 0:
        return []
    step = len(rows) / limit
    return [rows[int(i * step)] for i in range(limit)]
