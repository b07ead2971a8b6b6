"""Benchmark datasets as loaders yielding `BenchRow`s (one registry: name -> loader).

The public sets live outside the repo (they are not ours to redistribute): by default in
`../shared/datasets/` relative to the repository root, or wherever `--data` points. This repo's
own ground truth lives in `benchmarks/groundtruth/*.csv` of the repository itself.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peakmem.datasets.gpumemnet_jobs import JobParseError, parse_cnn, parse_mlp, parse_transformer
from peakmem.datasets.rows import GPU_TOTAL_BYTES, BenchRow, MiB
from peakmem.inputs import InputError, describe, open_regular_file

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


class DatasetFormatError(InputError):
    """A dataset file with missing columns or a bad value: `FILE:LINE: what is wrong`."""


MAX_JOB_INT = 2**31 - 1
"""The largest size, count or batch a dataset row may describe (a bigger one is not a job)."""
MAX_MEASURED_MIB = 2**30
"""A measured or total memory figure above 1 PiB is not a measurement."""


DATA_DIR_ENV = "PEAKMEM_DATASETS"
"""Environment variable naming the data directory when `--data` is not given (checkouts that do
not sit next to `shared/`, e.g. git worktrees)."""


def default_data_dir() -> Path | None:
    """$PEAKMEM_DATASETS, else `../shared/datasets/` next to the repository root, when it exists."""
    from_env = os.environ.get(DATA_DIR_ENV)
    candidate = Path(from_env) if from_env else REPO_ROOT.parent / "shared" / "datasets"
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


Where = tuple[Path, int]


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[Where, dict[str, str]]]:
    """((file, line), row) for each row of a CSV file: UTF-8 (a BOM is allowed), under the
    input-file cap, every `required` column in the header, as many fields as the header in
    every row, each field under csv's field limit. DatasetFormatError otherwise."""
    if not path.is_file():
        raise DatasetUnavailable(f"missing dataset file {path}")
    try:
        binary = open_regular_file(path)
    except InputError as exc:
        raise DatasetFormatError(exc.detail, exc.path or path) from None
    with binary, io.TextIOWrapper(binary, encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        try:
            header = reader.fieldnames
            if not header:
                raise DatasetFormatError("empty file: no header row", path, 1)
            missing = [c for c in required if c not in header]
            if missing:
                raise DatasetFormatError(f"missing columns {', '.join(missing)}", path, 1)
            for row in reader:
                where = (path, reader.line_num)
                if None in row:
                    raise DatasetFormatError(
                        f"{len(header) + len(row[None])} fields, the header has {len(header)}",  # type: ignore[index]
                        path,
                        reader.line_num,
                    )
                if any(value is None for value in row.values()):
                    short = sum(value is not None for value in row.values())
                    raise DatasetFormatError(
                        f"{short} fields, the header has {len(header)}", path, reader.line_num
                    )
                yield where, row
        except csv.Error as exc:
            raise DatasetFormatError(f"not a CSV row ({exc})", path, reader.line_num) from None
        except UnicodeDecodeError:
            raise DatasetFormatError("not UTF-8 text", path, reader.line_num + 1) from None


def _number(
    raw: dict[str, str], column: str, where: Where, *, integer: bool = False,
    minimum: float = 0, maximum: float = math.inf, blank: Any = ...,
) -> Any:
    """The number in `column`: finite, within [minimum, maximum], an integer if asked; a blank
    cell gives `blank` when one is given."""
    text = raw[column].strip()
    if not text and blank is not ...:
        return blank
    try:
        value: float | int = int(text) if integer else float(text)
    except ValueError:
        value = math.nan
    kind = "an integer" if integer else "a number"
    if (
        isinstance(value, float) and not math.isfinite(value)
        or not minimum <= value <= maximum
    ):
        bounds = f">= {minimum:g}" if maximum == math.inf else f"from {minimum:g} to {maximum:g}"
        raise DatasetFormatError(
            f"column {column!r} is {describe(text)}, expected {kind} {bounds}", *where
        )
    return value


def _choice(raw: dict[str, str], column: str, where: Where, choices: dict[str, Any]) -> Any:
    value = raw[column].strip()
    if value not in choices:
        raise DatasetFormatError(
            f"column {column!r} is {describe(value)}, expected one of {', '.join(choices)}",
            *where,
        )
    return choices[value]


def _text(raw: dict[str, str], column: str, where: Where, limit: int = 1000) -> str:
    value = raw[column].strip()
    if not value or len(value) > limit:
        raise DatasetFormatError(
            f"column {column!r} is {describe(value)}, expected text of 1 to {limit} characters",
            *where,
        )
    return value


def _job(parse: Callable[..., Any], where: Where, *args: Any) -> Any:
    """A GPUMemNet job from its launcher file name, its numbers checked."""
    try:
        job = parse(*args)
    except (JobParseError, ValueError) as exc:
        raise DatasetFormatError(str(exc), *where) from None
    for item in dataclasses.fields(job):
        value = getattr(job, item.name)
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not 0 <= value <= MAX_JOB_INT:
            raise DatasetFormatError(
                f"job {item.name} is {describe(value)}, expected 0 to {MAX_JOB_INT}", *where
            )
        if isinstance(value, float) and not 0.0 <= value <= 1.0:
            raise DatasetFormatError(
                f"job {item.name} is {describe(value)}, expected 0 to 1", *where
            )
    return job


def _gpumemnet_status(row: dict[str, str]) -> str:
    return "oom" if row.get("Status", "SUCCESSFUL") == "OOM_CRASH" else "ok"


_MEMORY_MIB = "Max GPU Memory (MiB)"
_GPUMEMNET_STATUS = {"SUCCESSFUL": "ok", "OOM_CRASH": "oom"}


def _gpumemnet_row(
    dataset: str, index: int, family: str, job: object, raw: dict[str, str], where: Where
) -> BenchRow:
    if "Status" in raw:
        _choice(raw, "Status", where, _GPUMEMNET_STATUS)
    return BenchRow(
        id=f"{index:05d}",
        dataset=dataset,
        family=family,
        job=job,
        measured_peak_bytes=int(_number(raw, _MEMORY_MIB, where, maximum=MAX_MEASURED_MIB) * MiB),
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
        rows = _csv_rows(data_dir / "gpumemnet" / filename, ("Filename", _MEMORY_MIB))
        for index, (where, raw) in enumerate(rows):
            job = _job(parse_mlp, where, raw["Filename"])
            if skip_single_output and job.output_size == 1:
                continue  # step 1: crashed at the loss (README), not a memory measurement
            yield _gpumemnet_row(dataset, index, f"mlp-{job.arch}", job, raw, where)

    return load


def load_gpumemnet_cnn(data_dir: Path) -> Iterator[BenchRow]:
    """cnn_data_step1_prefix.csv, then the cnn_data_sample14.csv rows not already in it.

    Rows with memory 0 are failed runs (README): skipped.
    """
    seen: set[str] = set()
    index = 0
    for name in ("cnn_data_step1_prefix.csv", "cnn_data_sample14.csv"):
        for where, raw in _csv_rows(data_dir / "gpumemnet" / name, ("Filename", _MEMORY_MIB)):
            filename = raw["Filename"]
            if filename in seen:
                continue
            seen.add(filename)
            this_index = index
            index += 1
            if _number(raw, _MEMORY_MIB, where, maximum=MAX_MEASURED_MIB) <= 0:
                continue
            try:
                job = _job(parse_cnn, where, filename, raw.get("Activations-Params") or None)
            except DatasetFormatError:
                # layer list unusable: dense cannot be rebuilt
                job = _job(parse_cnn, where, filename)
            yield _gpumemnet_row("gpumemnet-cnn", this_index, f"cnn-{job.arch}", job, raw, where)


def _load_transformer(dataset: str, filename: str) -> Callable[[Path], Iterator[BenchRow]]:
    """GPUMemNet Transformer rows of `filename`; OOM_CRASH rows stay in the set as status "oom"."""

    def load(data_dir: Path) -> Iterator[BenchRow]:
        rows = _csv_rows(data_dir / "gpumemnet" / filename, ("Filename", _MEMORY_MIB))
        for index, (where, raw) in enumerate(rows):
            job = _job(parse_transformer, where, raw["Filename"])
            yield _gpumemnet_row(dataset, index, "transformer", job, raw, where)

    return load


load_gpumemnet_transformer = _load_transformer("gpumemnet-transformer", "transformer_data_sample.csv")
"""The 952-row Transformer sample (869 ran, 83 OOM_CRASH), spread over the whole published set."""
load_gpumemnet_transformer17 = _load_transformer(
    "gpumemnet-transformer17", "transformer_data_sample17.csv"
)
"""The earlier 17-row sample (every row is also in the 952-row file, under another id)."""


def _timm_family(model: str) -> str:
    match = re.match(r"[a-z]+", model)
    return match.group(0) if match else model


def timm_status(raw: dict[str, str], gpu_total_bytes: int, where: Where | None = None) -> str:
    """The set has no status column. A row whose published naive FakeTensor peak (the tensors
    live over forward + backward: a lower bound of what the job allocates) exceeds the GPU cannot
    have run: its measured number is where an out-of-memory stopped it, so it is an OOM row."""
    if "faketensor_mib" not in raw:
        return "ok"
    lower_bound = _number(
        raw, "faketensor_mib", where or (Path("<row>"), 0), maximum=MAX_MEASURED_MIB, blank=None
    )
    if lower_bound is not None and lower_bound * MiB > gpu_total_bytes:
        return "oom"
    return "ok"


def load_timm(data_dir: Path) -> Iterator[BenchRow]:
    """timm models x batch sizes on the A100-40GB (torch 2.4.1 assumed, as the rest of the set)."""
    total = GPU_TOTAL_BYTES[GPUMEMNET_GPU]
    rows = _csv_rows(
        data_dir / "gpumemnet" / "timm_measured.csv", ("model", "batch_size", "measured_mib")
    )
    for index, (where, raw) in enumerate(rows):
        model = _text(raw, "model", where, 200)
        batch = _number(raw, "batch_size", where, integer=True, minimum=1, maximum=MAX_JOB_INT)
        yield BenchRow(
            id=f"{index:05d}",
            dataset="timm",
            family=_timm_family(model),
            job={"library": "timm", "model": model, "batch_size": batch},
            measured_peak_bytes=int(
                _number(raw, "measured_mib", where, maximum=MAX_MEASURED_MIB) * MiB
            ),
            status=timm_status(raw, total, where),
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
    places: dict[str, Where] = {}
    order: list[str] = []
    columns = (
        "run_dir", "model", "batch_size", "optimizer", "gpu_name", "gpu_total_mib",
        "measured_peak_mib", "real_oom", "estimator", "estimate_mib",
    )
    for where, raw in _csv_rows(data_dir / "xmem" / "xmem_runs.csv", columns):
        key = _text(raw, "run_dir", where)
        _number(raw, "estimate_mib", where, maximum=MAX_MEASURED_MIB, blank=None)
        run = runs.get(key)
        if run is None:
            run = runs[key] = dict(raw)
            places[key] = where
            order.append(key)
        run[f"published:{_text(raw, 'estimator', where, 200)}"] = raw["estimate_mib"]
    for index, key in enumerate(order):
        raw = runs[key]
        where = places[key]
        gpu_name = _text(raw, "gpu_name", where, 200)
        gpu = _XMEM_GPUS.get(gpu_name, gpu_name.lower().replace(" ", "-"))
        model = _text(raw, "model", where, 200)
        yield BenchRow(
            id=f"{index:05d}",
            dataset="xmem",
            family=model,
            job={
                "library": "torchvision/transformers",
                "model": model,
                "batch_size": _number(
                    raw, "batch_size", where, integer=True, minimum=1, maximum=MAX_JOB_INT
                ),
                "optimizer": _text(raw, "optimizer", where, 200),
            },
            measured_peak_bytes=int(
                _number(raw, "measured_peak_mib", where, maximum=MAX_MEASURED_MIB) * MiB
            ),
            status=_choice(raw, "real_oom", where, {"True": "oom", "False": "ok"}),
            gpu=gpu,
            torch_version=XMEM_TORCH,
            gpu_total_bytes=int(
                _number(raw, "gpu_total_mib", where, minimum=1, maximum=MAX_MEASURED_MIB) * MiB
            ),
            features=raw,
            # xMem's ground truth is max(NVML used - used at the first sample); the first sample
            # is taken after `torch.cuda.set_per_process_memory_fraction` created the context
            # (exp/trainer/__init__.py FastRunner.train_on_gpu, exp/run.py _get_ground_truth).
            measured_includes_context=False,
        )


_GROUNDTRUTH_STATUS = {"ok": "ok", "oom": "oom"}


def is_probe_output(path: Path) -> bool:
    """`<gpu>_<probe>.csv` beside the run files (h200_first_use.csv: first_use_probe.py) holds a
    probe's rows, not `peakmem measure` runs: the run files are named after the GPU alone."""
    return "_" in path.stem


def load_groundtruth(
    _data_dir: Path | None, directory: Path = GROUNDTRUTH_DIR
) -> Iterator[BenchRow]:
    """This repo's own measurements (`peakmem measure`); rows with another status are skipped."""
    files = sorted(
        path for path in (directory.glob("*.csv") if directory.is_dir() else ())
        if not is_probe_output(path)
    )
    if not files:
        raise DatasetUnavailable(
            f"no ground truth yet: {directory} has no *.csv (run `peakmem measure` on a GPU)"
        )
    from peakmem.allocator.rules import UnknownTorchVersion, parse_version
    from peakmem.profiles import ProfileError, load_gpu

    for path in files:
        for index, (where, raw) in enumerate(_csv_rows(path, GROUNDTRUTH_COLUMNS)):
            status = _GROUNDTRUTH_STATUS.get(raw["status"].strip().lower())
            if status is None or not raw["measured_peak_bytes"].strip():
                continue
            gpu = _text(raw, "gpu", where, 100)
            torch_version = _text(raw, "torch", where, 100)
            try:
                profile = load_gpu(gpu)
                parse_version(torch_version)
            except (ProfileError, UnknownTorchVersion) as exc:
                raise DatasetFormatError(str(exc), *where) from None
            job = _text(raw, "job", where)
            yield BenchRow(
                id=f"{path.stem}:{index:05d}",
                dataset="groundtruth",
                family=job.split(":")[0].split("/")[-1].removesuffix(".py"),
                job={"job": job, "args": raw["args"]},
                measured_peak_bytes=_number(
                    raw, "measured_peak_bytes", where, integer=True, maximum=MAX_MEASURED_MIB * MiB
                ),
                status=status,  # type: ignore[arg-type]
                gpu=gpu,
                torch_version=torch_version,
                gpu_total_bytes=GPU_TOTAL_BYTES.get(gpu, profile.total_memory_bytes),
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
            "GPUMemNet Transformer encoders, A100-40GB (952 rows, 83 OOM)",
            load_gpumemnet_transformer,
        ),
        DatasetSpec(
            "gpumemnet-transformer17",
            "GPUMemNet Transformer encoders, the earlier 17-row sample, A100-40GB",
            load_gpumemnet_transformer17,
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
