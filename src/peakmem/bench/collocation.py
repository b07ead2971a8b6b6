"""Collocation simulation: pack a stream of jobs onto GPUs by an estimator's numbers, then see what
the real peaks do.

Jobs are placed by `peakmem.schedule.pack.assign`, the placement core of `peakmem pack`, with
its policies (first-fit: jobs arrive in order and go onto the first GPU whose reserved sum of
estimates leaves room); a job whose estimate exceeds the GPU is rejected (a scheduler cannot
place it). A GPU OOMs
when the sum of its jobs' real peaks exceeds its capacity; every job on it counts as hit. Idle
memory is capacity minus the real peaks on GPUs that did not OOM. All jobs run at once (the
worst case of overlapping peaks), as in the GPUMemNet paper's collocation argument.

`pai_like_stream` draws job sizes shaped like the Alibaba PAI 2020 trace (cluster-trace-gpu-v2020,
`max_gpu_wrk_mem` and `plan_gpu`). The trace cannot be downloaded here, so the distribution is an
ASSUMPTION, not a fit: max_gpu_wrk_mem ~ lognormal with median 2 GiB and sigma 1.2 (p90 ~ 9.3 GiB,
p99 ~ 33 GiB; most instances use little memory and a tail uses most of a GPU, as the NSDI'22
paper's characterization describes), clipped to [0.1 GiB, capacity]; plan_gpu in {25, 50, 100} %
of a GPU with probabilities {0.2, 0.3, 0.5}. Replace it with the real columns when the trace is at
hand (`stream_from_sizes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GiB = 2**30

PAI_MEDIAN_BYTES = 2 * GiB
PAI_SIGMA = 1.2
PAI_MIN_BYTES = GiB // 10
PAI_PLAN_GPU = (25, 50, 100)
PAI_PLAN_GPU_P = (0.2, 0.3, 0.5)


@dataclass(frozen=True)
class Job:
    real_peak_bytes: int
    estimate_bytes: int


@dataclass(frozen=True)
class PackingResult:
    jobs: int
    placed: int
    rejected: int
    gpus_used: int
    oom_gpus: int
    jobs_oom: int  # placed jobs that share a GPU that ran out of memory
    idle_bytes: int  # capacity - real peaks, summed over GPUs that did not OOM
    idle_fraction: float  # idle_bytes / capacity of the GPUs that did not OOM

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def pack_first_fit(jobs: Sequence[Job], capacity_bytes: int) -> PackingResult:
    return pack_jobs(jobs, capacity_bytes, "first-fit")


def pack_jobs(jobs: Sequence[Job], capacity_bytes: int, policy: str = "first-fit") -> PackingResult:
    """Place `jobs` by their estimates on as many `capacity_bytes` GPUs as needed, with
    `peakmem pack`'s placement (`policy`), then judge the placement by the real peaks."""
    from peakmem.schedule.pack import assign

    where = assign([j.estimate_bytes for j in jobs], [capacity_bytes] * len(jobs), policy)
    used = sorted({b for b in where if b is not None})
    slot = {b: i for i, b in enumerate(used)}
    real = [0] * len(used)
    members = [0] * len(used)
    for job, b in zip(jobs, where, strict=True):
        if b is not None:
            real[slot[b]] += job.real_peak_bytes
            members[slot[b]] += 1
    rejected = sum(b is None for b in where)
    oom = [r > capacity_bytes for r in real]
    healthy = [r for r, o in zip(real, oom, strict=True) if not o]
    idle = sum(capacity_bytes - r for r in healthy)
    return PackingResult(
        jobs=len(jobs),
        placed=len(jobs) - rejected,
        rejected=rejected,
        gpus_used=len(used),
        oom_gpus=sum(oom),
        jobs_oom=sum(m for m, o in zip(members, oom, strict=True) if o),
        idle_bytes=idle,
        idle_fraction=idle / (capacity_bytes * len(healthy)) if healthy else 0.0,
    )


def pai_like_sizes(n: int, capacity_bytes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(max_gpu_wrk_mem bytes, plan_gpu percent) for n instances, drawn as documented above."""
    rng = np.random.default_rng(seed)
    peaks = rng.lognormal(np.log(PAI_MEDIAN_BYTES), PAI_SIGMA, n)
    peaks = np.clip(peaks, PAI_MIN_BYTES, capacity_bytes).astype(np.int64)
    plan = rng.choice(PAI_PLAN_GPU, size=n, p=PAI_PLAN_GPU_P)
    return peaks, plan


def stream_from_sizes(
    real_peaks: Sequence[int], ratios: Sequence[float], seed: int = 0
) -> list[Job]:
    """Jobs whose estimates follow an estimator's observed estimate/measured ratios (resampled)."""
    rng = np.random.default_rng(seed)
    picked = rng.choice(np.asarray(ratios, dtype=float), size=len(real_peaks))
    return [Job(int(p), int(p * r)) for p, r in zip(real_peaks, picked, strict=True)]


def simulate_estimators(
    real_peaks: Sequence[int],
    ratios_by_estimator: dict[str, Sequence[float]],
    capacity_bytes: int,
    seed: int = 0,
) -> dict[str, PackingResult]:
    """Pack the same stream once per estimator, plus `oracle` (estimates = real peaks)."""
    results = {"oracle": pack_first_fit([Job(int(p), int(p)) for p in real_peaks], capacity_bytes)}
    for name, ratios in ratios_by_estimator.items():
        if len(ratios):
            stream = stream_from_sizes(real_peaks, ratios, seed)
            results[name] = pack_first_fit(stream, capacity_bytes)
    return results
