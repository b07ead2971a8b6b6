"""Read GPU profiles (`data/gpus/*.toml`) and software stacks (`data/stacks/*.toml`).

Every number in a profile is a `Sourced` value: the value and where it came from (a measurement,
a cited report, or "assumed" with a reason). Estimates list the assumed values they used.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

DATA_PACKAGE = "peakmem.profiles"


class ProfileError(ValueError):
    """A profile is unknown or malformed."""


@dataclass(frozen=True)
class Sourced:
    """A number and where it came from."""

    value: Any
    source: str
    reason: str | None = None

    @property
    def assumed(self) -> bool:
        return self.source.strip().lower().startswith("assumed")

    def describe(self) -> str:
        return f"{self.source}: {self.reason}" if self.reason else self.source


@dataclass(frozen=True)
class GpuProfile:
    name: str
    device_name: str
    aliases: tuple[str, ...]
    total_memory: Sourced
    compute_capability: Sourced
    sm_count: Sourced
    throughput: dict[str, float] = field(default_factory=dict, compare=False)
    """Peak rates for the utilization model (`[throughput]`: TFLOP/s per unit, memory GB/s,
    clocks, warps and blocks per SM); `throughput_source` says where they come from."""
    throughput_source: str = field(default="", compare=False)

    @property
    def total_memory_bytes(self) -> int:
        return int(self.total_memory.value)

    @property
    def capability(self) -> tuple[int, int]:
        major, minor = str(self.compute_capability.value).split(".")
        return int(major), int(minor)


@dataclass(frozen=True)
class StackProfile:
    name: str
    torch_min: tuple[int, int]
    cublas_workspace: dict[str, Sourced]
    cublaslt_transient: Sourced
    context: dict[str, Sourced] = field(default_factory=dict)
    cublaslt_workspace: Sourced | None = None
    """A persistent cuBLASLt workspace each thread's Lt handle takes from the caching allocator
    at its first Lt call (None: the stack has none; `cublaslt_workspace_bytes`)."""
    conv_workspace: dict[str, Sourced] = field(default_factory=dict)
    """Per GPU profile name (or "default"): cuDNN convolution workspace model, a Sourced whose
    value maps a direction (forward / backward_data / backward_weight) to a factor."""
    conv_workspace_table: dict[str, Sourced] = field(default_factory=dict)
    """Per GPU profile name: a measured per-shape cuDNN workspace table (value: its file under
    data/, profiles/conv_workspace_table.py), used before `conv_workspace` where it has one."""
    library: dict[str, dict[str, Sourced]] = field(default_factory=dict)
    """Per GPU profile name (or "default"): device memory a library loads outside the caching
    allocator on first use, by library/kernel family."""
    safety_margin: dict[str, dict[str, Sourced]] = field(default_factory=dict)
    """Per GPU profile name (or "default"): the fraction to add to an estimate so that <= 1% of
    a calibration split's jobs are underestimated, by kind of job ("default", or the library
    whose calibrated model the estimate leans on, e.g. "cudnn_convolution")."""
    kernel_workspace: dict[str, Sourced] = field(default_factory=dict)
    """Library workspaces of single kernels by name (e.g. cuDNN batch norm), each sourced."""
    cuda_version: tuple[int, int] = (12, 1)
    """The CUDA the stack's torch wheels are built with (decides lazy module loading)."""
    cudnn_version: int = 90100
    """The cuDNN the stack's wheels load, as `torch.backends.cudnn.version()` reports it (9.1.0,
    which the cu121 / cu124 wheels of torch 2.4 to 2.6 bundle, where the stack file says none)."""
    arch_list: tuple[str, ...] = ()
    """`torch.cuda.get_arch_list()` of the stack's wheels: every architecture they were built
    for (`sm_XY`, `compute_XY` for PTX), not only the GPU's (empty: the GPU's own, where the
    stack file names none)."""
    driver_version: str = "550.54.15"
    """The NVIDIA driver a GPU run of this stack had (`nvidia-smi`'s "Driver Version",
    NVML's `nvmlSystemGetDriverVersion`)."""
    driver_cuda_version: tuple[int, int] = (12, 4)
    """The newest CUDA that driver supports (`nvidia-smi`'s "CUDA Version",
    `nvmlSystemGetCudaDriverVersion`): the driver's, not the wheels' `cuda_version`."""
    lazy_loaded: dict[str, Sourced] = field(default_factory=dict)
    """Per GPU profile name (or "default"): the part of the context figure that CUDA's lazy
    module loading brings in after the context is created, on the job's first kernel launches
    (torch's and cuBLAS's kernel images). A measurement whose baseline is taken right after
    the context was created (xMem's) contains this part and not the rest."""
    first_use: dict[str, dict[str, Sourced]] = field(default_factory=dict)
    """Per GPU profile name (no default): the measured first-use model of the memory outside the
    allocator (`first_use_bytes`: `base`, the context and first kernel, and bytes per kernel
    family, estimate/first_use.py). Where a GPU has one, its base is the context figure and the
    families a job runs are charged as libraries."""
    saved_inputs: dict[str, Sourced] = field(default_factory=dict)
    """Per composite aten op ("softmax.int"): the stack's autograd saved the op's input for
    backward where the torch the capture runs does not (cuda_rules/saved_inputs.py)."""

    def kernel_workspace_bytes(self, name: str) -> int:
        """The size of a named kernel workspace; 0 where the stack does not list it."""
        found = self.kernel_workspace.get(name)
        return int(found.value) if found is not None else 0

    def cublas_workspace_for(self, capability: tuple[int, int]) -> Sourced:
        key = f"{capability[0]}.{capability[1]}"
        if key in self.cublas_workspace:
            return self.cublas_workspace[key]
        major_key = f"{capability[0]}.0"
        if major_key in self.cublas_workspace:
            return self.cublas_workspace[major_key]
        return self.cublas_workspace["default"]

    def context_for(self, gpu: GpuProfile, environ: Mapping[str, str] | None = None) -> Sourced:
        """The CUDA context for `gpu`: the stack's calibrated figure for it, else the context
        model (data/contexts/: by module-loading mode and architecture), else the stack's
        default."""
        measured = self.first_use_table(gpu, environ).get("base")
        if measured is not None:
            return measured
        calibrated = self.context.get(gpu.name)
        if calibrated is not None:
            return calibrated
        modelled = context_model(self.module_loading(environ), gpu)
        return modelled if modelled is not None else self.context["default"]

    def first_use_table(
        self, gpu: GpuProfile, environ: Mapping[str, str] | None = None
    ) -> dict[str, Sourced]:
        """The GPU's first-use model (`first_use_bytes`; measured under lazy module loading, so
        {} when the job loads modules eagerly) or {}."""
        if self.module_loading(environ) != "lazy":
            return {}
        return self.first_use.get(gpu.name, {})

    def module_loading(self, environ: Mapping[str, str] | None = None) -> str:
        """"lazy" or "eager": lazy when the stack's CUDA has lazy loading (11.7+) and
        CUDA_MODULE_LOADING (peakmem's environment, which the job inherits) does not say EAGER."""
        env = os.environ if environ is None else environ
        if env.get("CUDA_MODULE_LOADING", "").strip().upper() == "EAGER":
            return "eager"
        return "lazy" if self.cuda_version >= LAZY_LOADING_CUDA else "eager"

    def lazy_loaded_for(self, gpu: GpuProfile) -> Sourced:
        """The kernel images loaded after context creation (`lazy_loaded`), 0 where the stack
        has no figure for `gpu` (the whole context then counts as loaded at creation)."""
        return self.lazy_loaded.get(gpu.name, self.lazy_loaded.get("default")) or Sourced(
            0, "assumed", f"no lazily loaded kernel figure for {gpu.name} in the {self.name} stack profile"
        )

    def conv_workspace_for(self, gpu: GpuProfile) -> Sourced:
        return self.conv_workspace.get(
            gpu.name, self.conv_workspace.get("default", _NO_CONV_WORKSPACE)
        )

    def conv_workspace_table_for(self, gpu: GpuProfile) -> Sourced | None:
        """The measured workspace table for `gpu` (`[cudnn_workspace_table.<gpu>]`), or None."""
        return self.conv_workspace_table.get(gpu.name)

    def safety_margin_for(self, gpu: GpuProfile, kind: str) -> Sourced:
        """The margin fitted for `kind` jobs on `gpu` (else on any GPU of this stack); a kind
        without a figure in this stack takes the stack's `default` margin."""
        found = _per_gpu(self.safety_margin, gpu, kind)
        if found is None and kind != "default":
            found = _per_gpu(self.safety_margin, gpu, "default")
        return found or Sourced(0.0, "assumed", f"no margin fitted for {kind} jobs on {gpu.name}")

    def library_bytes_for(self, gpu: GpuProfile, family: str) -> Sourced:
        """A library's first-use memory (`library_bytes`), else a kernel family's of the GPU's
        first-use model (`first_use_bytes`), else 0 (assumed)."""
        return (
            _per_gpu(self.library, gpu, family)
            or self.first_use_table(gpu).get(family)
            or Sourced(0, "assumed", f"no figure for {family} in the {self.name} stack profile")
        )


def _per_gpu(table: dict[str, dict[str, Sourced]], gpu: GpuProfile, name: str) -> Sourced | None:
    """`table[gpu][name]`, else `table["default"][name]`, else None."""
    for key in (gpu.name, "default"):
        found = table.get(key, {}).get(name)
        if found is not None:
            return found
    return None


_NO_CONV_WORKSPACE = Sourced({}, "assumed", "no cuDNN workspace model for this GPU: none counted")


def _sourced(raw: Any, where: str) -> Sourced:
    if not isinstance(raw, dict) or "value" not in raw or "source" not in raw:
        raise ProfileError(f"{where}: expected a table with `value` and `source`")
    return Sourced(raw["value"], str(raw["source"]), raw.get("reason"))


CONV_MODEL_CLASSES = ("stem", "pointwise")
"""Classes of convolution a workspace model may give factors of their own
(cuda_rules/convolution.py CONV_CLASSES, which says what each is)."""
CONV_MODEL_TERMS = ("", "_per_weight", "_per_lowered")
"""Factor suffixes: the bytes read, the weight's bytes, the im2col operand's bytes."""
CONV_MODEL_KEYS = tuple(
    f"{prefix}{direction}{suffix}"
    for prefix in ("", *(f"{name}_" for name in CONV_MODEL_CLASSES))
    for direction in ("forward", "backward_data", "backward_weight")
    for suffix in CONV_MODEL_TERMS
)
"""Every factor a `[cudnn_conv_workspace.<gpu>]` table may hold besides `benchmark`."""


def _conv_model(raw: Any, where: str) -> Sourced:
    if not isinstance(raw, dict) or "source" not in raw:
        raise ProfileError(f"{where}: expected a table with direction factors and `source`")
    keys = (*CONV_MODEL_KEYS, "benchmark")
    unknown = set(raw) - set(keys) - {"source", "reason"}
    if unknown:
        raise ProfileError(f"{where}: unknown keys {sorted(unknown)}")
    factors = {key: float(raw[key]) for key in keys if key in raw}
    return Sourced(factors, str(raw["source"]), raw.get("reason"))


def _read_dir(kind: str) -> dict[str, dict[str, Any]]:
    folder = resources.files(DATA_PACKAGE).joinpath("data", kind)
    tables: dict[str, dict[str, Any]] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            try:
                tables[entry.name] = tomllib.loads(entry.read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as exc:
                raise ProfileError(f"{kind}/{entry.name}: {exc}") from None
    return tables


LAZY_LOADING_CUDA = (11, 7)
"""The first CUDA with lazy module loading (NVIDIA CUDA 11.7 release notes)."""


@cache
def _contexts() -> dict[str, dict[str, Sourced]]:
    """data/contexts/*.toml: mode -> architecture ("7", "8", "9" or "default") -> context."""
    model: dict[str, dict[str, Sourced]] = {}
    for filename, table in _read_dir("contexts").items():
        for mode, by_arch in table.items():
            for arch, raw in by_arch.items():
                model.setdefault(mode, {})[arch] = _sourced(raw, f"contexts/{filename} {mode}.{arch}")
    return model


def context_model(mode: str, gpu: GpuProfile) -> Sourced | None:
    """The modelled context for a module-loading mode on `gpu`'s architecture (None: no figure)."""
    by_arch = _contexts().get(mode, {})
    found = by_arch.get(str(gpu.capability[0])) or by_arch.get("default")
    if found is None:
        return None
    reason = f"{found.reason}; {mode} module loading" if found.reason else f"{mode} module loading"
    return Sourced(found.value, found.source, reason)


def _throughput(raw: Any, where: str) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise ProfileError(f"{where}: [throughput] must be a table")
    values = {}
    for key, value in raw.items():
        if key.endswith("source"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ProfileError(f"{where}: throughput {key} must be a positive number")
        values[key] = float(value)
    return values


@cache
def _gpus() -> dict[str, GpuProfile]:
    profiles: dict[str, GpuProfile] = {}
    for filename, table in _read_dir("gpus").items():
        where = f"gpus/{filename}"
        profile = GpuProfile(
            name=table["name"],
            device_name=table["device_name"],
            aliases=tuple(table.get("aliases", [])),
            total_memory=_sourced(table.get("total_memory_bytes"), f"{where} total_memory_bytes"),
            compute_capability=_sourced(
                table.get("compute_capability"), f"{where} compute_capability"
            ),
            sm_count=_sourced(table.get("sm_count"), f"{where} sm_count"),
            throughput=_throughput(table.get("throughput", {}), where),
            throughput_source=str(table.get("throughput", {}).get("source", "")),
        )
        profiles[profile.name] = profile
    return profiles


def known_gpus() -> list[str]:
    """Names of the GPU profiles shipped with peakmem."""
    return sorted(_gpus())


def load_gpu(name: str) -> GpuProfile:
    """The GPU profile called `name` (or one of its aliases); case-insensitive."""
    wanted = name.strip().lower()
    for profile in _gpus().values():
        if wanted == profile.name or wanted in profile.aliases:
            return profile
    shown = name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS - 3] + "..."
    # a 10 kB name was echoed whole (the message cut at 2000 characters, the known list lost)
    raise ProfileError(f"unknown GPU {shown!r}; known GPUs: {', '.join(known_gpus())}")


_SHOWN_NAME_CHARS = 80
"""The most characters of an unknown GPU name its error shows."""


def _version_tuple(version: str) -> tuple[int, int]:
    parts = version.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ProfileError(f"not a torch version: {version!r}") from None


@cache
def _stacks() -> list[StackProfile]:
    stacks = []
    for filename, table in _read_dir("stacks").items():
        where = f"stacks/{filename}"
        stacks.append(
            StackProfile(
                name=table["name"],
                torch_min=_version_tuple(table["torch_min"]),
                cublas_workspace={
                    key: _sourced(raw, f"{where} cublas_workspace_bytes.{key}")
                    for key, raw in table["cublas_workspace_bytes"].items()
                },
                cublaslt_transient=_sourced(
                    table["cublaslt_transient_bytes"], f"{where} cublaslt_transient_bytes"
                ),
                cublaslt_workspace=(
                    _sourced(table["cublaslt_workspace_bytes"], f"{where} cublaslt_workspace_bytes")
                    if "cublaslt_workspace_bytes" in table else None
                ),
                context={
                    key: _sourced(raw, f"{where} context_bytes.{key}")
                    for key, raw in table["context_bytes"].items()
                },
                conv_workspace={
                    key: _conv_model(raw, f"{where} cudnn_conv_workspace.{key}")
                    for key, raw in table.get("cudnn_conv_workspace", {}).items()
                },
                conv_workspace_table={
                    key: _sourced(raw, f"{where} cudnn_workspace_table.{key}")
                    for key, raw in table.get("cudnn_workspace_table", {}).items()
                },
                library={
                    key: {
                        family: _sourced(entry, f"{where} library_bytes.{key}.{family}")
                        for family, entry in families.items()
                    }
                    for key, families in table.get("library_bytes", {}).items()
                },
                safety_margin={
                    key: {
                        kind: _sourced(entry, f"{where} safety_margin.{key}.{kind}")
                        for kind, entry in kinds.items()
                    }
                    for key, kinds in table.get("safety_margin", {}).items()
                },
                kernel_workspace={
                    key: _sourced(raw, f"{where} kernel_workspace_bytes.{key}")
                    for key, raw in table.get("kernel_workspace_bytes", {}).items()
                },
                cuda_version=_version_tuple(str(table.get("cuda_version", "12.1"))),
                cudnn_version=int(table.get("cudnn_version", 90100)),
                arch_list=tuple(str(arch) for arch in table.get("arch_list", ())),
                driver_version=str(table.get("driver_version", "550.54.15")),
                driver_cuda_version=_version_tuple(str(table.get("driver_cuda_version", "12.4"))),
                lazy_loaded={
                    key: _sourced(raw, f"{where} lazy_loaded_bytes.{key}")
                    for key, raw in table.get("lazy_loaded_bytes", {}).items()
                },
                first_use={
                    key: {
                        family: _sourced(entry, f"{where} first_use_bytes.{key}.{family}")
                        for family, entry in families.items()
                    }
                    for key, families in table.get("first_use_bytes", {}).items()
                },
                saved_inputs={
                    key: _sourced(raw, f"{where} saved_inputs.{key}")
                    for key, raw in table.get("saved_inputs", {}).items()
                },
            )
        )
    return sorted(stacks, key=lambda s: s.torch_min)


def load_stack(torch_version: str) -> StackProfile:
    """The software stack for a target torch version: the newest stack whose `torch_min` is not
    above it. A version peakmem has no allocator rules for (allocator.rules.KNOWN_VERSIONS:
    older than 2.4, newer than the newest known, or not a version) is refused by name with the
    known versions listed (ProfileError)."""
    from peakmem.allocator.rules import UnknownTorchVersion, parse_version

    try:
        wanted = parse_version(torch_version)
    except UnknownTorchVersion as exc:
        raise ProfileError(str(exc)) from None
    chosen = None
    for stack in _stacks():
        if stack.torch_min <= wanted:
            chosen = stack
    if chosen is None:
        oldest = ".".join(map(str, _stacks()[0].torch_min))
        raise ProfileError(f"no software stack for torch {torch_version}; the oldest known is {oldest}")
    return chosen
