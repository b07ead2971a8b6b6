"""The request each scheduler takes for a job, from its estimate (`peakmem estimate --json`).

`container_request(estimate, fmt)` gives the Kubernetes container/pod fields a format sets
(the admission webhook codes against it); `render(estimate, fmt)` the snippet `--emit FORMAT`
prints: a Pod manifest built and validated with the official Kubernetes Python client's models
for the Kubernetes formats, the lines to add for the others. `FORMATS` is the registry, by
`--emit` name; each entry cites the scheduler's documentation it follows.

Memory figures are the estimate's `peak_bytes_with_margin` (the device-level peak, CUDA context
included, plus the calibrated safety margin), rounded UP to whole MiB; fractions of a GPU are
rounded up too, so a request never holds less than the estimate with its margin. Options (all
formats): `gpu` (profile name) and `capacity_bytes` override the estimate's GPU (`pack` passes
the GPU or slice a job was placed on); the formats' own options are listed in their entry.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MIB = 2**20


class EmitError(ValueError):
    """The estimate cannot be expressed in this format (one line saying why)."""


@dataclass(frozen=True)
class ContainerRequest:
    limits: dict[str, str]  # container resources.limits
    requests: dict[str, str]  # container resources.requests
    annotations: dict[str, str]  # pod metadata.annotations
    env: dict[str, str]  # container env
    node_selector: dict[str, str]  # pod spec.nodeSelector


@dataclass(frozen=True)
class Job:
    """What the formats need from an estimate."""

    bytes_with_margin: int
    capacity_bytes: int
    gpu: str | None
    smact: float | None
    alloc_conf: str
    reserved_with_margin: int
    options: dict[str, Any]

    @property
    def mib(self) -> int:
        return max(1, math.ceil(self.bytes_with_margin / MIB))

    @property
    def fraction(self) -> float:
        """The share of the GPU's memory, rounded up to 1/100."""
        return _ceil(self.bytes_with_margin / self.capacity_bytes, 2)

    @property
    def cores_percent(self) -> int | None:
        """SM share in percent: option `gpucores`, else the estimate's utilization.smact."""
        given = self.options.get("gpucores")
        if given is not None:
            value = _number(given, "gpucores")
            if not 1 <= value <= 100:
                raise EmitError(f"gpucores must be from 1 to 100, got {given!r}")
            return int(math.ceil(value))
        if self.smact is None:
            return None
        return max(1, min(100, math.ceil(self.smact * 100)))


def _ceil(value: float, digits: int) -> float:
    scale = 10**digits
    return math.ceil(value * scale - 1e-9) / scale


def _finite(value: Any) -> bool:
    """A real, finite number (not a bool)."""
    return (
        not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    )


def _number(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise EmitError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise EmitError(f"{name} must be a finite number, got {value!r}")
    return number


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    docs: str
    """The documentation the format follows."""
    request: Callable[[Job], ContainerRequest] | None
    """Kubernetes fields (None: not a Kubernetes format)."""
    text: Callable[[Job], str] | None = None
    """The snippet of a non-Kubernetes format."""
    scheduler_name: str | None = None
    options: tuple[str, ...] = ()
    labels: Callable[[Job], dict[str, str]] = field(default=lambda job: {})


def _request(
    limits: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> ContainerRequest:
    return ContainerRequest(
        limits=dict(limits or {}),
        requests={},
        annotations=dict(annotations or {}),
        env=dict(env or {}),
        node_selector=dict(node_selector or {}),
    )


def _one_gpu(job: Job, what: str) -> None:
    if job.bytes_with_margin > job.capacity_bytes:
        raise EmitError(
            f"the job needs {job.mib} MiB with its margin, more than one {job.gpu or 'GPU'} "
            f"({math.floor(job.capacity_bytes / MIB)} MiB); {what} cannot share a GPU it does not fit"
        )


def _vgpu_limits(what: str, count: str, memory: str, cores: str) -> Callable[[Job], ContainerRequest]:
    """A device-plugin format of limits: one (virtual) GPU, its memory in MiB, optionally its
    cores in percent."""

    def request(job: Job) -> ContainerRequest:
        _one_gpu(job, what)
        limits = {count: "1", memory: str(job.mib)}
        if job.cores_percent is not None:
            limits[cores] = str(job.cores_percent)
        return _request(limits)

    return request


# --- HAMi: https://github.com/Project-HAMi/HAMi (README "Usage": nvidia.com/gpu, nvidia.com/gpumem
#     in MiB per GPU, nvidia.com/gpucores in percent; examples/nvidia/default_use.yaml)
_hami = _vgpu_limits("HAMi", "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")

# --- Volcano vGPU: volcano-sh/volcano docs/user-guide/how_to_use_volcano_vgpu.md (limits
#     volcano.sh/vgpu-number, volcano.sh/vgpu-memory in MiB, volcano.sh/vgpu-cores in percent;
#     schedulerName volcano)
_volcano = _vgpu_limits(
    "Volcano vGPU", "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"
)


# --- NVIDIA KAI Scheduler (ex Run:ai): NVIDIA/KAI-Scheduler docs/gpu-sharing/README.md: pod
#     annotation `gpu-memory` (MiB) or `gpu-fraction` (share of one GPU's memory), schedulerName
#     kai-scheduler, queue label (`kai.scheduler/queue`; older releases `runai/queue`). KAI does
#     not enforce the limit: the job must stay within it (the torch format caps it).
def _kai(job: Job) -> ContainerRequest:
    _one_gpu(job, "KAI GPU sharing")
    if _truthy(job.options.get("fraction", False)):
        return _request(annotations={"gpu-fraction": f"{max(job.fraction, 0.01):g}"})
    return _request(annotations={"gpu-memory": str(job.mib)})


_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _kai_labels(job: Job) -> dict[str, str]:
    queue = job.options.get("queue")
    if not queue:
        return {}
    key = str(job.options.get("queue_label", "kai.scheduler/queue"))
    if not _LABEL_KEY.match(key) or len(key) > 316:
        raise EmitError(f"queue_label {key!r} is not a Kubernetes label key")
    if not _LABEL_VALUE.match(str(queue)):
        raise EmitError(f"queue {str(queue)!r} is not a Kubernetes label value (63 characters of A-Z a-z 0-9 - _ .)")
    return {key: str(queue)}


# --- Kubernetes MIG (NVIDIA k8s-device-plugin, mixed strategy): resources nvidia.com/mig-<profile>;
#     https://github.com/NVIDIA/k8s-device-plugin#configuration-option-details (MIG_STRATEGY)
def _mig_for(job: Job):
    from peakmem.schedule.mig import MigError, load_mig, mig_gpus, mig_profiles, smallest_fitting

    if job.gpu is None:
        raise EmitError("the estimate names no GPU; give option gpu=PROFILE")
    try:
        given = job.options.get("mig")
        if given:
            mig = load_mig(job.gpu, str(given))
            if mig.capacity_bytes < job.bytes_with_margin:
                raise EmitError(
                    f"MIG {mig.name} of {mig.gpu} holds {mig.capacity_bytes // MIB} MiB; the job needs {job.mib} MiB"
                )
            return mig
        if not mig_profiles(job.gpu):
            raise EmitError(
                f"{job.gpu} has no MIG profiles (peakmem knows MIG on {', '.join(mig_gpus())})"
            )
        mig = smallest_fitting(job.gpu, job.bytes_with_margin)
        if mig is None:
            raise EmitError(
                f"no MIG profile of {job.gpu} holds the job's {job.mib} MiB with its margin"
            )
        return mig
    except (MigError, ValueError) as exc:
        if isinstance(exc, EmitError):
            raise
        raise EmitError(str(exc)) from None


def _k8s_mig(job: Job) -> ContainerRequest:
    mig = _mig_for(job)
    return _request({f"nvidia.com/mig-{mig.name}": "1"})


# --- Slurm: https://slurm.schedmd.com/gres.html ("Sharding": --gres=shard:N; "MIG Management":
#     MIG slices are gpu GRES of their own type, --gres=gpu:<type>:1; sites name the type
#     <gpu>_<profile>, e.g. --gres=gpu:a100_1g.5gb:1 on the Alliance and CSC clusters)
def _slurm(job: Job) -> str:
    opts = job.options
    mig = opts.get("mig")
    if mig is not None and str(mig).strip().lower() not in ("", "0", "false", "no", "off"):
        if _truthy(mig):  # mig=true: the smallest profile that fits
            job = Job(**{**job.__dict__, "options": {**opts, "mig": None}})
        profile = _mig_for(job)
        # Sites name MIG GRES types <gpu>_<profile> (gres.conf Type=, e.g. a100_1g.5gb);
        # gres_type= gives the site's own name
        gres_type = opts.get("gres_type") or f"{profile.gpu.split('-')[0]}_{profile.name}"
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", str(gres_type)):
            raise EmitError(f"gres_type {gres_type!r} is not a GRES type name")
        return f"#SBATCH --gres=gpu:{gres_type}:1"
    per_shard = opts.get("mib_per_shard")
    shards_per_gpu = opts.get("shards_per_gpu")
    if per_shard is None and shards_per_gpu is not None:
        count = _number(shards_per_gpu, "shards_per_gpu")
        if count < 1:
            raise EmitError(f"shards_per_gpu must be at least 1, got {shards_per_gpu!r}")
        per_shard = math.floor(job.capacity_bytes / MIB / count)
    if per_shard is None:
        raise EmitError(
            "slurm needs the site's shard size: --mib-per-shard MIB (or emit option "
            "shards_per_gpu=N, or mig=true for a MIG GRES)"
        )
    size = _number(per_shard, "mib_per_shard")
    if size < 1:
        raise EmitError(f"mib_per_shard must be at least 1, got {per_shard!r}")
    _one_gpu(job, "Slurm shards")
    shards = math.ceil(job.mib / size)
    return f"#SBATCH --gres=shard:{shards}"


# --- NVIDIA MPS: https://docs.nvidia.com/deploy/mps/ (Appendix: Environment Variables,
#     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="<device>=<limit>", e.g. "0=1G,1=512M")
def _mps_env(job: Job) -> dict[str, str]:
    _one_gpu(job, "MPS")
    device = job.options.get("device", 0)
    if not re.fullmatch(r"\d{1,3}", str(device)):
        raise EmitError(f"device must be a GPU index, got {device!r}")
    return {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{device}={job.mib}M"}


def _mps(job: Job) -> ContainerRequest:
    return _request(env=_mps_env(job))


def _mps_text(job: Job) -> str:
    (key, value), = _mps_env(job).items()
    return f'export {key}="{value}"'


# --- Ray: https://docs.ray.io/en/latest/ray-core/scheduling/accelerators.html (fractional
#     num_gpus; Ray does not cap memory: the fraction is bookkeeping)
def _ray(job: Job) -> str:
    _one_gpu(job, "a fractional Ray GPU")
    return f"@ray.remote(num_gpus={max(job.fraction, 0.01):g})"


# --- PyTorch: torch.cuda.set_per_process_memory_fraction (caps what the caching allocator
#     reserves at fraction x the device's total memory) and PYTORCH_CUDA_ALLOC_CONF (the
#     allocator settings the estimate simulated);
#     https://pytorch.org/docs/stable/generated/torch.cuda.memory.set_per_process_memory_fraction.html
def torch_fraction(job: Job) -> float:
    fraction = _ceil(job.reserved_with_margin / job.capacity_bytes, 4)
    if fraction > 1:
        raise EmitError(
            f"the job reserves {math.ceil(job.reserved_with_margin / MIB)} MiB with its margin, more "
            f"than the GPU's {math.floor(job.capacity_bytes / MIB)} MiB"
        )
    return max(fraction, 0.0001)


def _torch(job: Job) -> ContainerRequest:
    torch_fraction(job)
    return _request(env={"PYTORCH_CUDA_ALLOC_CONF": job.alloc_conf} if job.alloc_conf else {})


def _torch_text(job: Job) -> str:
    fraction = torch_fraction(job)
    lines = [
        "# in the job, before its first CUDA allocation:",
        f"torch.cuda.set_per_process_memory_fraction({fraction:g})",
    ]
    if job.alloc_conf:
        lines.append(f"# in its environment:\nexport PYTORCH_CUDA_ALLOC_CONF={_shell(job.alloc_conf)}")
    else:
        lines.append("# PYTORCH_CUDA_ALLOC_CONF: leave unset (the estimate assumed the defaults)")
    return "\n".join(lines)


def _shell(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


FORMATS: dict[str, Format] = {
    "hami": Format(
        "hami", "HAMi: nvidia.com/gpumem (MiB) and nvidia.com/gpucores limits",
        "https://github.com/Project-HAMi/HAMi#usage", _hami, options=("gpucores",),
    ),
    "volcano": Format(
        "volcano", "Volcano vGPU: volcano.sh/vgpu-memory (MiB) limits",
        "https://github.com/volcano-sh/volcano/blob/master/docs/user-guide/how_to_use_volcano_vgpu.md",
        _volcano, scheduler_name="volcano", options=("gpucores",),
    ),
    "kai": Format(
        "kai", "NVIDIA KAI Scheduler: gpu-memory (MiB) or gpu-fraction pod annotation",
        "https://github.com/NVIDIA/KAI-Scheduler/blob/main/docs/gpu-sharing/README.md",
        _kai, scheduler_name="kai-scheduler", options=("fraction", "queue", "queue_label"),
        labels=_kai_labels,
    ),
    "runai": Format(
        "runai", "Run:ai (KAI's origin): the same gpu-memory / gpu-fraction annotations",
        "https://github.com/NVIDIA/KAI-Scheduler/blob/main/docs/gpu-sharing/README.md",
        _kai, scheduler_name="kai-scheduler", options=("fraction", "queue", "queue_label"),
        labels=_kai_labels,
    ),
    "k8s-mig": Format(
        "k8s-mig", "Kubernetes MIG (mixed strategy): nvidia.com/mig-<smallest profile that fits>",
        "https://github.com/NVIDIA/k8s-device-plugin#configuration-option-details",
        _k8s_mig, options=("mig",),
    ),
    "slurm": Format(
        "slurm", "Slurm: --gres=shard:N (given the MiB per shard) or a MIG GRES",
        "https://slurm.schedmd.com/gres.html#Sharding", None, text=_slurm,
        options=("mib_per_shard", "shards_per_gpu", "mig", "gres_type"),
    ),
    "mps": Format(
        "mps", "NVIDIA MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "https://docs.nvidia.com/deploy/mps/appendix-environment-variables.html", _mps,
        text=_mps_text, options=("device",),
    ),
    "ray": Format(
        "ray", "Ray: num_gpus fraction", "https://docs.ray.io/en/latest/ray-core/scheduling/accelerators.html",
        None, text=_ray,
    ),
    "torch": Format(
        "torch", "PyTorch: set_per_process_memory_fraction value and PYTORCH_CUDA_ALLOC_CONF",
        "https://pytorch.org/docs/stable/generated/torch.cuda.memory.set_per_process_memory_fraction.html",
        _torch, text=_torch_text,
    ),
}

COMMON_OPTIONS = ("gpu", "capacity_bytes", "image", "name", "command")


def check_format(fmt: str) -> Format:
    found = FORMATS.get(str(fmt).strip().lower())
    if found is None:
        raise ValueError(f"unknown emit format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return found


def _job(estimate: dict[str, Any], entry: Format, options: dict[str, Any]) -> Job:
    if not isinstance(estimate, dict):
        raise EmitError("the estimate must be a `peakmem estimate --json` object")
    unknown = set(options) - set(COMMON_OPTIONS) - set(entry.options)
    if unknown:
        known = ", ".join(COMMON_OPTIONS + entry.options)
        raise EmitError(f"{entry.name} takes no option {', '.join(sorted(unknown))} (options: {known})")
    with_margin = estimate.get("peak_bytes_with_margin", estimate.get("peak_bytes"))
    if not _finite(with_margin) or with_margin < 0:
        raise EmitError("the estimate has no `peak_bytes_with_margin`")
    gpu = options.get("gpu") or estimate.get("gpu")
    capacity = options.get("capacity_bytes")
    if capacity is None and options.get("gpu"):
        from peakmem.profiles import ProfileError, load_gpu

        try:
            capacity = load_gpu(str(options["gpu"])).total_memory_bytes
        except ProfileError as exc:
            raise EmitError(str(exc)) from None
    if capacity is None:
        capacity = estimate.get("capacity_bytes")
    if not _finite(capacity) or capacity <= 0:
        raise EmitError("the estimate has no positive `capacity_bytes`; give option gpu=PROFILE")
    margin = estimate.get("safety_margin", 0.0)
    margin = float(margin) if _finite(margin) and 0 <= margin <= 100 else 0.0
    reserved = estimate.get("peak_reserved_bytes", with_margin)
    if not _finite(reserved) or reserved < 0:
        reserved = with_margin
    utilization = estimate.get("utilization")
    smact = utilization.get("smact") if isinstance(utilization, dict) else None
    if not _finite(smact) or not 0 <= smact <= 1:
        smact = None
    conf = estimate.get("alloc_conf") or ""
    return Job(
        bytes_with_margin=int(math.ceil(with_margin)),
        capacity_bytes=int(capacity),
        gpu=str(gpu) if gpu else None,
        smact=smact,
        alloc_conf=str(conf),
        reserved_with_margin=int(math.ceil(reserved * (1 + margin))),
        options=dict(options),
    )


def container_request(estimate: dict, fmt: str, **options: Any) -> ContainerRequest:
    """The Kubernetes fields `fmt` sets for the job of `estimate`. ValueError for an unknown
    format (naming the known ones); EmitError (a ValueError) where the format has no
    Kubernetes form (slurm, ray) or cannot hold the job."""
    entry = check_format(fmt)
    if entry.request is None:
        raise EmitError(f"{entry.name} is not a Kubernetes format; use render() for its snippet")
    return entry.request(_job(estimate, entry, options))


_DNS = re.compile(r"[^a-z0-9-]+")


def pod_name(text: str) -> str:
    """A DNS-1123 name from a job's name."""
    name = _DNS.sub("-", str(text).lower()).strip("-")[:63].strip("-")
    return name or "peakmem-job"


def _kubernetes_client() -> Any:
    try:
        from kubernetes import client
    except ImportError:
        raise EmitError(
            "Pod manifests need the kubernetes package: pip install 'peakmem[schedule]'"
        ) from None
    return client


def build_pod(estimate: dict, fmt: str, **options: Any) -> Any:
    """A kubernetes.client.V1Pod carrying the request of `fmt` (only for Kubernetes formats)."""
    client = _kubernetes_client()

    entry = check_format(fmt)
    request = container_request(estimate, fmt, **options)
    job = _job(estimate, entry, options)
    command = options.get("command")
    if command is not None and not (
        isinstance(command, (list, tuple)) and all(isinstance(a, str) for a in command)
    ):
        raise EmitError("command must be a list of strings")
    container = client.V1Container(
        name="job",
        image=str(options.get("image") or "IMAGE"),
        command=list(command) if command else None,
        env=[client.V1EnvVar(name=k, value=v) for k, v in request.env.items()] or None,
        resources=client.V1ResourceRequirements(
            limits=request.limits or None, requests=request.requests or None
        ),
    )
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=pod_name(options.get("name") or "peakmem-job"),
            annotations=request.annotations or None,
            labels=entry.labels(job) or None,
        ),
        spec=client.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            scheduler_name=entry.scheduler_name,
            node_selector=request.node_selector or None,
        ),
    )


def pod_dict(estimate: dict, fmt: str, **options: Any) -> dict[str, Any]:
    """The Pod manifest as the API server takes it (camelCase keys, no nulls)."""
    return _kubernetes_client().ApiClient().sanitize_for_serialization(build_pod(estimate, fmt, **options))


def render(estimate: dict, fmt: str, **options: Any) -> str:
    """The snippet `--emit FMT` prints: a Pod manifest (YAML) for the Kubernetes formats
    (hami, volcano, kai, runai, k8s-mig), the lines to add for slurm, mps, ray and torch."""
    entry = check_format(fmt)
    job = _job(estimate, entry, options)
    if entry.text is not None:
        return entry.text(job)
    import yaml

    return yaml.safe_dump(pod_dict(estimate, fmt, **options), sort_keys=False).rstrip()
