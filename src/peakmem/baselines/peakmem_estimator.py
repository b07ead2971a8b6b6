"""peakmem's own estimate as a bench row: the row's job script through `peakmem estimate`.

Each dataset maps its rows to a job script in `benchmarks/zoo/` (the rebuilt job, unchanged from
what a user would run), estimated on the row's GPU profile and torch version exactly as
`peakmem estimate --gpu G --torch V -- python benchmarks/zoo/<job>.py ...` does:

- GPUMemNet rows run `gpumemnet.py --config <Filename>`;
- xMem rows run `xmem_hf.py --model M --batch-size B --optimizer OPT` for the Hugging Face models
  whose config `hf_configs.py` holds, and `xmem_cnn.py --model M --batch-size B --optimizer OPT`
  for its torchvision CNNs;
- timm rows (GPUMemNet's timm set) run `timm_train.py --model M --batch-size B`;
- this repo's own measurements (`groundtruth`, benchmarks/groundtruth/*.csv) run the measured
  command itself (the row's `job` and `args`), for the row's `steps` and `alloc_conf`.

The CNN and timm jobs need the optional `torchvision` / `timm` package: where it is missing, the
row says so (CannotEstimate) before anything runs.

Where a dataset's measurement starts from a baseline taken right after the CUDA context was
created (`BenchRow.measured_includes_context` False: xMem's first NVML sample follows
`set_per_process_memory_fraction`, whose `cudaMemGetInfo` creates the context), the estimate
compared is `after_context_creation_bytes`: the device-level peak less the context as it stands
at creation, i.e. the caching allocator's peak reserve + libraries loaded on first use (cuDNN) +
the kernel images CUDA's lazy loading brings in on the job's first launches (the stack profile's
`lazy_loaded_bytes`, part of its context figure).
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import shlex
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext, redirect_stderr, redirect_stdout
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from peakmem.baselines.base import CannotEstimate, Estimate, Estimator, MissingPackage
from peakmem.datasets.loaders import GROUNDTRUTH_DIR
from peakmem.datasets.rows import BenchRow

REPO = Path(__file__).resolve().parents[3]
ZOO = REPO / "benchmarks" / "zoo"
GPUMEMNET_JOB = ZOO / "gpumemnet.py"
XMEM_JOB = ZOO / "xmem_hf.py"
XMEM_CNN_JOB = ZOO / "xmem_cnn.py"
TIMM_JOB = ZOO / "timm_train.py"

# xMem's torchvision CNNs (perf_estimator/models.py AllModels), spelled as its runs record them.
XMEM_CNNS = frozenset({
    "VGG11", "VGG16", "VGG19", "ResNet50", "ResNet101", "ResNet152", "MobileNetV2",
    "MobeNetV3Small", "MobeNetV3Large", "MnasNet", "ConvNeXtTiny", "ConvNeXtBase",
    "RegNetX400MF", "RegNetX32GF", "RegNetY400MF", "RegNetY32GF",
})


def _require(path: Path) -> None:
    if not path.exists():
        raise CannotEstimate(f"missing {path} (run from a source checkout)")


def has_package(name: str) -> bool:
    """Whether the optional package ``name`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _require_package(name: str, what: str) -> None:
    if not has_package(name):
        raise MissingPackage(f"{what} needs the optional `{name}` package (not installed)")


def gpumemnet_command(row: BenchRow) -> list[str]:
    _require(GPUMEMNET_JOB)
    # DataLoader workers only move host data: no device memory, so none are started here.
    command = ["python", str(GPUMEMNET_JOB), "--config", row.features["Filename"],
               "--num-workers", "0"]
    transitions = getattr(row.job, "dense_transitions", None)
    if transitions is not None:
        command += ["--dense-transitions", ",".join(str(i) for i in transitions)]
    return command


@cache
def _hf_configs() -> ModuleType:
    path = ZOO / "hf_configs.py"
    _require(path)
    name = "peakmem_zoo_hf_configs"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def xmem_command(row: BenchRow) -> list[str]:
    model = row.job["model"]
    if model in XMEM_CNNS:
        return xmem_cnn_command(row)
    if _hf_configs().lookup(model) is None:
        raise CannotEstimate(f"{model}: no config in benchmarks/zoo/hf_configs.py")
    _require(XMEM_JOB)
    command = ["python", str(XMEM_JOB), "--model", model,
               "--batch-size", str(row.job["batch_size"]), "--optimizer", row.job["optimizer"]]
    return command + _zero_grad_mode(row)


def _zero_grad_mode(row: BenchRow) -> list[str]:
    mode = row.features.get("zero_grad_mode_recorded", "").strip()
    return ["--zero-grad-mode", str(int(float(mode)))] if mode else []


# The zero_grad placement xMem's CNN ground-truth runs used when their record holds none
# (`zero_grad_mode_recorded` blank: the runs made before `exp/run.py` recorded
# `"zero_grad_mode": config.trainer.zero_out`). Then `FastRunner.train_on_gpu`
# (exp/trainer/__init__.py) built `ModelTrainer(...)` without `zero_grad_mode=`, so
# `ModelTrainer.__init__`'s default `zero_grad_mode: int = 1` (exp/trainer/trainer.py) reached
# `conv_train_loop`, whose mode 1 calls `optimizer.zero_grad()` after the forward, just before
# `loss_value.backward()` (exp/trainer/train_loop.py; the older loop's own default was 1 too,
# "1: optimizer.zero_grad() just before loss.backward()"): the previous step's gradients stay
# alive through the forward. Only the later FastRunner passes `config.trainer.zero_out`, and
# those runs record it.
XMEM_CNN_UNRECORDED_ZERO_GRAD_MODE = 1


def xmem_cnn_command(row: BenchRow) -> list[str]:
    """xMem's torchvision CNN runs: `xmem_cnn.py` (xMem's conv_train_loop, CIFAR-10 at 86x86),
    with the recorded zero_grad mode, else `XMEM_CNN_UNRECORDED_ZERO_GRAD_MODE`."""
    model = row.job["model"]
    _require_package("torchvision", f"{model}: xMem's torchvision CNN job")
    _require(XMEM_CNN_JOB)
    mode = _zero_grad_mode(row) or ["--zero-grad-mode", str(XMEM_CNN_UNRECORDED_ZERO_GRAD_MODE)]
    return ["python", str(XMEM_CNN_JOB), "--model", model,
            "--batch-size", str(row.job["batch_size"]), "--optimizer", row.job["optimizer"],
            *mode]


def timm_command(row: BenchRow) -> list[str]:
    """GPUMemNet's timm rows: `timm_train.py` (timm defaults, Adam lr 1e-3 assumed)."""
    model = row.job["model"]
    _require_package("timm", f"{model}: the timm job")
    _require(TIMM_JOB)
    return ["python", str(TIMM_JOB), "--model", model,
            "--batch-size", str(row.job["batch_size"])]


# Where a ground-truth CSV has no `<gpu>_versions.json` next to it (the sweeps before 2026-11-27
# did not record one; benchmarks/sweep.py writes it now): ASSUMED, not read. h100-80gb's rows
# (leases of 2026-11-26) are taken to have run the image the H200 lease of 2026-11-27 recorded
# (benchmarks/groundtruth/h200_versions.json: transformers 5.17.0), the same image by the session
# notes, against 5.24 installed here.
ASSUMED_GROUNDTRUTH_TRANSFORMERS_RELEASE = "5.17.0"


def groundtruth_transformers_release(gpu: str) -> str:
    """The transformers release of the image the GPU's ground-truth rows were measured with:
    `benchmarks/groundtruth/<gpu>_versions.json` (measure/image_versions.py), else the
    documented assumption above. A versions file that is not readable JSON, not an object, or
    whose transformers is not a release number is a ValueError naming it (the bench stops in
    one line: cli/bench.py), never the assumption. The estimate runs the job with the installed
    release and puts back the older release's behaviours that change allocations
    (capture/hf_release.py)."""
    from peakmem.capture.hf_release import parse_release
    from peakmem.measure.image_versions import read_versions, versions_path

    versions = read_versions(GROUNDTRUTH_DIR / f"{gpu}.csv")  # ValueError naming a bad file
    release = versions.get("transformers") if versions is not None else None
    if release is None:  # no file, or transformers was not installed there
        return ASSUMED_GROUNDTRUTH_TRANSFORMERS_RELEASE
    try:
        if not isinstance(release, str) or len(release) > 64:
            raise ValueError
        parse_release(release)
    except ValueError:
        raise ValueError(f"{versions_path(GROUNDTRUTH_DIR / f'{gpu}.csv')}: transformers "
                         f"{str(release)[:40]!r} is not a release number") from None
    return release


def groundtruth_command(row: BenchRow) -> list[str]:
    """The measured command: `python JOB ARGS` (JOB a repo-relative script) or `python -m MODULE
    ARGS` (JOB spelled `-m MODULE`)."""
    job, args = row.job["job"].strip(), shlex.split(row.job.get("args") or "")
    if job.startswith("-m "):
        return ["python", "-m", job[3:].strip(), *args]
    path = REPO / job
    _require(path)
    return ["python", str(path), *args]


def row_environment(row: BenchRow) -> dict[str, str]:
    """Environment variables the row's estimate runs its job with: the transformers release the
    measuring machine ran (`PEAKMEM_TRANSFORMERS_RELEASE`), where it is known."""
    from peakmem.capture.hf_release import RELEASE_VARIABLE

    release = (groundtruth_transformers_release(row.gpu)
               if row.dataset.startswith("groundtruth") else None)
    return {RELEASE_VARIABLE: release} if release else {}


def row_steps(row: BenchRow) -> int | None:
    """Optimizer steps the row's measurement ran (`peakmem measure --steps`), where it says."""
    raw = str(row.features.get("steps", "")).strip() if row.features else ""
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def row_alloc_conf(row: BenchRow) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF of the measured run, where the row records one."""
    raw = str(row.features.get("alloc_conf", "")).strip() if row.features else ""
    return raw or None


GPUMEMNET_CNN_STEPS = 10
"""Optimizer steps the default capture traces of a GPUMemNet CNN row: `gpumemnet.py` runs
`2 * len(loader) + 2` steps, and its `RandomImages` epoch (64 full batches) is shortened to 3
full batches and its last, so `len(loader)` says 4."""


def row_capture_options(row: BenchRow) -> dict[str, Any]:
    """`estimate_command` options for the row: its measured `steps` and `alloc_conf` where it
    records them; `repeat_steady` (capture.step_repeat) for the GPUMemNet CNN rows.

    A GPUMemNet CNN row's job (`gpumemnet.py`, a CNN config) trains on 64 full batches per epoch
    (`RandomImages`, 64 x batch size samples): under the default step policy it runs 10 steps of
    full batches (epoch 1 shortened to 4, the loop ended after step 6, later epochs one batch
    each) and ends by itself. Stopped at `--steps 10` instead, it runs the same 10 full batches
    with the same events up to step 10's optimizer step (no loop-ended mark, and the job is
    stopped there rather than returning: both only free memory), so the peak, reserved and
    allocated figures are the same, and its steps repeat: 4 run, steps 5-10 are repeated
    (tests/capture/test_step_repeat_bench.py compares both on rows of every architecture). The
    trace's utilization record differs (step 10 no longer opens a DataLoader epoch): not read
    here; `bench --metric utilization` captures its rows itself."""
    options: dict[str, Any] = {}
    if (steps := row_steps(row)) is not None:
        options["steps"] = steps
    elif row.dataset == "gpumemnet-cnn":
        options["steps"] = GPUMEMNET_CNN_STEPS
        options["repeat_steady"] = True
    if (alloc_conf := row_alloc_conf(row)) is not None:
        options["alloc_conf"] = alloc_conf
    return options


# dataset name prefix -> the row's job command
JOB_COMMANDS: dict[str, Callable[[BenchRow], list[str]]] = {
    "gpumemnet": gpumemnet_command,
    "xmem": xmem_command,
    "timm": timm_command,
    "groundtruth": groundtruth_command,
}


def job_command(row: BenchRow) -> list[str]:
    """The command line whose estimate this row's measurement is compared with."""
    for prefix, command in JOB_COMMANDS.items():
        if row.dataset.startswith(prefix):
            return command(row)
    raise CannotEstimate(f"no job script for dataset {row.dataset!r} yet")


def context_at_creation_bytes(estimate) -> int:
    """The part of the estimate's CUDA context present as soon as the context exists: the
    context figure less the kernel images lazy loading brings in later (never below 0)."""
    from peakmem.estimate.first_use import FIRST_USE_FAMILIES

    lazy = int(estimate.stack.lazy_loaded_for(estimate.gpu).value)
    # where the GPU has a first-use model, its kernel families are part of what loads lazily
    libraries = getattr(estimate, "libraries", {})
    kernels = sum(v for k, v in libraries.items() if k in FIRST_USE_FAMILIES)
    return max(0, estimate.context_bytes + kernels - lazy)


def after_context_creation_bytes(estimate) -> int:
    """What a measurement with its baseline taken right after context creation sees: the
    device-level peak less the context at creation (xMem: max(NVML used - used at the first
    sample))."""
    return estimate.peak_bytes - context_at_creation_bytes(estimate)


def compared_bytes(row: BenchRow, estimate) -> int:
    """What the row's measurement is compared with: the device-level peak (nvidia-smi used),
    or `after_context_creation_bytes` where the dataset's baseline was taken after the context
    was created."""
    if row.measured_includes_context:
        return estimate.peak_bytes
    return after_context_creation_bytes(estimate)


@cache
def source_version() -> str:
    """A digest of everything a peakmem estimate depends on: the package's code and profile
    data, the zoo's job scripts and the ground truth's recorded versions (the bench cache key;
    a change recomputes the rows)."""
    digest = hashlib.sha1()
    package = Path(__file__).resolve().parents[1]
    files = sorted(package.rglob("*.py")) + sorted(package.rglob("*.toml")) + sorted(ZOO.glob("*.py"))
    files += sorted(GROUNDTRUTH_DIR.glob("*_versions.json"))  # the releases the rows ran
    for path in files:
        if "__pycache__" in path.parts:
            continue
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def stated_fraction(estimate, compared: int) -> float:
    """The stated margin as one fraction of the compared bytes: what `peak_bytes_with_margin`
    adds to the peak (the fractional margin and any reserve, estimate/margin_reserve.py), so
    that the bench's `compared x (1 + fraction)` is the stated figure."""
    added = estimate.peak_bytes_with_margin - estimate.peak_bytes
    if compared <= 0:
        return estimate.safety_margin
    return added / compared


class PeakmemEstimator(Estimator):
    name = "peakmem"

    @property
    def version(self) -> str:  # type: ignore[override]
        return source_version()

    def estimate_bytes(self, row: BenchRow) -> int:
        return compared_bytes(row, self.run(row))

    def estimate(self, row: BenchRow) -> Estimate:
        start = time.perf_counter()
        result = self.run(row)
        compared = compared_bytes(row, result)
        return Estimate(compared, time.perf_counter() - start,
                        stated_margin=stated_fraction(result, compared))

    def run(self, row: BenchRow):  # -> peakmem.estimate.Estimate
        from peakmem.capture.environment import environment_set
        from peakmem.capture.step_repeat import repeating_steady_steps
        from peakmem.estimate import EstimateError, estimate_capture, estimate_command
        from peakmem.profiles import load_gpu, load_stack

        argv = job_command(row)
        sink = io.StringIO()
        try:
            with redirect_stdout(sink), redirect_stderr(sink):
                # the bench's own generated jobs: in this (worker) process, as measured so far
                options = row_capture_options(row)
                repeat = repeating_steady_steps() if options.pop("repeat_steady", False) else (
                    nullcontext())
                with repeat, environment_set(row_environment(row)):
                    return estimate_command(argv, gpu=row.gpu, torch_version=row.torch_version,
                                            isolate=False, **options)
        except EstimateError as exc:
            capture = exc.capture
            if capture is None or not capture.trained or capture.exit_code == 124:
                raise CannotEstimate(str(exc).strip().splitlines()[-1]) from None
        # The job trained, then raised (e.g. BatchNorm on a last batch of 1, as the real job
        # did): what the GPU held up to the failure is what nvidia-smi recorded.
        gpu = load_gpu(row.gpu)
        return estimate_capture(capture, gpu, load_stack(row.torch_version),
                                torch_version=row.torch_version)
