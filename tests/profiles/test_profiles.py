
import pytest

from peakmem.profiles import ProfileError, known_gpus, load_gpu, load_stack

REQUIRED_GPUS = {
    "a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4", "l40s", "v100-32gb",
    "rtx3090", "rtx4090", "rtx3060-12gb", "rtx4060-8gb",
}


def test_every_required_gpu_has_a_sourced_profile():
    assert set(known_gpus()) >= REQUIRED_GPUS
    for name in known_gpus():
        gpu = load_gpu(name)
        for value in (gpu.total_memory, gpu.compute_capability, gpu.sm_count):
            assert value.source.strip(), f"{name}: a number without a source"
        assert 4 * 2**30 < gpu.total_memory_bytes < 200 * 2**30
        assert gpu.capability >= (7, 0) and int(gpu.sm_count.value) > 0


def test_aliases_and_case_are_accepted():
    assert load_gpu("H100").name == "h100-80gb"
    assert load_gpu("A100-SXM4-40GB").name == "a100-40gb"


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ProfileError) as info:
        load_gpu("tpu-v5")
    assert all(name in str(info.value) for name in REQUIRED_GPUS)


@pytest.mark.parametrize(
    "version, stack",
    [("2.4.1", "torch-2.4"), ("2.5.0+cu124", "torch-2.5"), ("2.10.0", "torch-2.6"),
     ("2.11.0+cu130", "torch-2.11"), ("2.13.0", "torch-2.11")],
)
def test_stack_for_a_torch_version(version, stack):
    assert load_stack(version).name == stack


def test_torch_2_11_stack_carries_the_h100_measurements():
    """The H100 figures of the torch-2.11 stack are the ones measured on the declared calibration
    split of benchmarks/groundtruth/h100-80gb.csv: the context outside the allocator of its runs
    without cuDNN convolutions, and the most its convolution runs added."""
    from peakmem.bench.calibration import in_calibration_split
    from peakmem.datasets.loaders import load_rows

    stack, h100 = load_stack("2.11.0+cu130"), load_gpu("h100-80gb")
    split = [r for r in load_rows("groundtruth") if in_calibration_split(r) and r.gpu == "h100-80gb"]
    conv_jobs = ("vision.py", "xmem_cnn.py", "unet.py", "detection.py")
    plain = {int(r.features["context_bytes"]) for r in split if not r.job["job"].endswith(conv_jobs)}
    assert plain == {stack.context_for(h100).value}
    conv = [int(r.features["context_bytes"]) - stack.context_for(h100).value
            for r in split if r.job["job"].endswith(conv_jobs)]
    assert max(conv) == stack.library_bytes_for(h100, "cudnn_convolution").value
    assert stack.context_for(h100).source.startswith("measured on the declared calibration split")
    # other GPUs keep the context model (nothing measured for them on this stack)
    assert stack.context_for(load_gpu("l4")).source == "assumed"


def test_stack_numbers():
    stack = load_stack("2.4.1")
    assert stack.cublas_workspace_for((8, 0)).value == 8519680
    assert stack.cublas_workspace_for((9, 0)).value == 32 * 2**20
    assert stack.cublaslt_transient.value == 2**20
    fitted = stack.context_for(load_gpu("a100-40gb"))  # fitted on the calibration split
    assert not fitted.assumed and "calibration split" in fitted.source
    context = stack.context_for(load_gpu("rtx4090"))  # not measured: the assumed default
    assert context.assumed and context.reason
    with pytest.raises(ProfileError, match="no allocator rules for torch 1.13.1; known: 2.4, 2.5"):
        load_stack("1.13.1")
