"""Each --emit format against its documented shape, and the Pod manifests against the
Kubernetes object model (the official client's models, round-tripped)."""

from __future__ import annotations

import re

import pytest
import yaml

from peakmem.schedule.emit import (
    FORMATS,
    ContainerRequest,
    EmitError,
    build_pod,
    container_request,
    pod_dict,
    render,
)

MIB = 2**20
A100_40 = 42505076736

EST = {
    "peak_bytes": 5000 * MIB,
    "peak_bytes_with_margin": 5075 * MIB + 1,  # rounds up to 5076 MiB
    "peak_reserved_bytes": 4000 * MIB,
    "safety_margin": 0.015,
    "capacity_bytes": A100_40,
    "gpu": "a100-40gb",
    "alloc_conf": "expandable_segments:True",
}
KUBERNETES = ("hami", "volcano", "kai", "runai", "k8s-mig")


def _as_pod(manifest: dict):
    """Deserialize a manifest into kubernetes.client.V1Pod (what the API client does with a
    server response): unknown shapes raise."""
    from kubernetes import client

    return client.ApiClient()._ApiClient__deserialize(manifest, "V1Pod")


def test_registry_has_every_documented_format():
    assert set(FORMATS) == {"hami", "volcano", "kai", "runai", "k8s-mig", "slurm", "mps", "ray", "torch"}
    for entry in FORMATS.values():
        assert entry.docs.startswith("https://")


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(ValueError, match="hami, volcano, kai"):
        render(EST, "yarn")
    with pytest.raises(ValueError, match="choose one of"):
        container_request(EST, "yarn")


def test_hami():
    req = container_request(EST, "hami")
    assert req == ContainerRequest(
        limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "5076"}, requests={}, annotations={},
        env={}, node_selector={},
    )
    with_util = container_request({**EST, "utilization": {"smact": 0.314}}, "hami")
    assert with_util.limits["nvidia.com/gpucores"] == "32"
    assert container_request(EST, "hami", gpucores="50").limits["nvidia.com/gpucores"] == "50"
    with pytest.raises(EmitError, match="gpucores"):
        container_request(EST, "hami", gpucores="150")


def test_volcano():
    req = container_request(EST, "volcano")
    assert req.limits == {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "5076"}
    assert pod_dict(EST, "volcano")["spec"]["schedulerName"] == "volcano"


def test_kai_memory_and_fraction():
    assert container_request(EST, "kai").annotations == {"gpu-memory": "5076"}
    # 5076 MiB of 40536 MiB = 0.1252... -> rounded up to 0.13
    assert container_request(EST, "kai", fraction="true").annotations == {"gpu-fraction": "0.13"}
    pod = pod_dict(EST, "kai", queue="team-a")
    assert pod["spec"]["schedulerName"] == "kai-scheduler"
    assert pod["metadata"]["labels"] == {"kai.scheduler/queue": "team-a"}
    assert pod_dict(EST, "runai", queue="q", queue_label="runai/queue")["metadata"]["labels"] == {
        "runai/queue": "q"
    }


def test_k8s_mig_smallest_profile_that_fits():
    assert container_request(EST, "k8s-mig").limits == {"nvidia.com/mig-1g.10gb": "1"}
    small = {**EST, "peak_bytes_with_margin": 3000 * MIB}
    assert container_request(small, "k8s-mig").limits == {"nvidia.com/mig-1g.5gb": "1"}
    assert container_request(small, "k8s-mig", gpu="h100-80gb").limits == {"nvidia.com/mig-1g.10gb": "1"}
    assert container_request(EST, "k8s-mig", mig="3g.20gb").limits == {"nvidia.com/mig-3g.20gb": "1"}
    with pytest.raises(EmitError, match="holds"):
        container_request(EST, "k8s-mig", mig="1g.5gb")
    with pytest.raises(EmitError, match="no MIG profiles"):
        container_request(EST, "k8s-mig", gpu="l4")
    with pytest.raises(EmitError, match="no MIG profile of a100-40gb holds"):
        container_request({**EST, "peak_bytes_with_margin": 41 * 10**9}, "k8s-mig")


def test_slurm_shards_and_mig_gres():
    assert render(EST, "slurm", mib_per_shard=1024) == "#SBATCH --gres=shard:5"  # 5076/1024 -> 5
    assert render(EST, "slurm", mib_per_shard=1000) == "#SBATCH --gres=shard:6"
    # 8 shards per 40536 MiB GPU = 5067 MiB each: 5076 MiB needs 2
    assert render(EST, "slurm", shards_per_gpu=8) == "#SBATCH --gres=shard:2"
    assert render(EST, "slurm", mig="true") == "#SBATCH --gres=gpu:a100_1g.10gb:1"
    assert render(EST, "slurm", mig="3g.20gb") == "#SBATCH --gres=gpu:a100_3g.20gb:1"
    assert render(EST, "slurm", mig="true", gres_type="mig1g") == "#SBATCH --gres=gpu:mig1g:1"
    with pytest.raises(EmitError, match="GRES type"):
        render(EST, "slurm", mig="true", gres_type="a b")
    with pytest.raises(EmitError, match="shard size"):
        render(EST, "slurm")
    with pytest.raises(EmitError, match="not a Kubernetes format"):
        container_request(EST, "slurm", mib_per_shard=1024)
    # what sbatch parses: --gres=name[:type]:count
    assert re.fullmatch(r"#SBATCH --gres=[a-z]+(:[\w.]+)?:\d+", render(EST, "slurm", mig="true"))


def test_mps():
    assert render(EST, "mps") == 'export CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=5076M"'
    assert container_request(EST, "mps", device="1").env == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "1=5076M"}
    with pytest.raises(EmitError, match="device"):
        render(EST, "mps", device="0,1")


def test_ray_fraction_rounds_up():
    assert render(EST, "ray") == "@ray.remote(num_gpus=0.13)"
    tiny = {**EST, "peak_bytes_with_margin": 1}
    assert render(tiny, "ray") == "@ray.remote(num_gpus=0.01)"


def test_torch_fraction_covers_reserved_with_margin():
    text = render(EST, "torch")
    fraction = float(re.search(r"set_per_process_memory_fraction\(([\d.]+)\)", text).group(1))
    assert fraction * A100_40 >= 4000 * MIB * 1.015
    assert fraction * A100_40 - 4000 * MIB * 1.015 < 1e-4 * A100_40
    assert "export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'" in text
    assert container_request(EST, "torch").env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert "leave unset" in render({**EST, "alloc_conf": ""}, "torch")


def test_jobs_that_do_not_fit_one_gpu_are_refused():
    huge = {**EST, "peak_bytes_with_margin": 2 * A100_40, "peak_reserved_bytes": 2 * A100_40}
    for fmt in ("hami", "volcano", "kai", "mps", "ray", "torch"):
        with pytest.raises(EmitError):
            render(huge, fmt)
    with pytest.raises(EmitError):
        render(huge, "slurm", mib_per_shard=1024)


def test_bad_estimates_and_options():
    with pytest.raises(EmitError, match="peak_bytes_with_margin"):
        render({"gpu": "l4"}, "hami")
    with pytest.raises(EmitError, match="capacity_bytes"):
        render({"peak_bytes_with_margin": 5}, "hami")
    assert container_request({"peak_bytes_with_margin": 5 * MIB}, "hami", gpu="l4").limits[
        "nvidia.com/gpumem"] == "5"
    with pytest.raises(EmitError, match="takes no option"):
        render(EST, "hami", queue="x")
    with pytest.raises(EmitError, match="unknown GPU"):
        render(EST, "hami", gpu="nope")


@pytest.mark.parametrize("fmt", KUBERNETES)
def test_pods_are_valid_kubernetes_objects(fmt):
    from kubernetes import client

    pod = build_pod(EST, fmt, name="My Job_1", image="repo/img:1", command=["python", "train.py"])
    assert isinstance(pod, client.V1Pod)
    text = render(EST, fmt, name="My Job_1", image="repo/img:1", command=["python", "train.py"])
    manifest = yaml.safe_load(text)
    assert manifest["apiVersion"] == "v1" and manifest["kind"] == "Pod"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", manifest["metadata"]["name"])
    again = _as_pod(manifest)
    assert again == pod  # the manifest is exactly the model
    container = again.spec.containers[0]
    assert container.image == "repo/img:1" and container.command == ["python", "train.py"]
    request = container_request(EST, fmt)
    assert (container.resources.limits or {}) == request.limits
    assert (again.metadata.annotations or {}) == request.annotations
    # extended resources are whole numbers (the API server refuses fractions for them)
    for key, value in request.limits.items():
        assert "/" in key and re.fullmatch(r"[1-9]\d*", value)


def test_pod_env_from_container_request():
    pod = build_pod(EST, "mps")
    assert [(e.name, e.value) for e in pod.spec.containers[0].env] == [
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=5076M")
    ]
