"""The CUDA context model: by module-loading mode (the stack's CUDA, CUDA_MODULE_LOADING) and GPU
architecture, with the calibrated per-GPU figures of a stack winning."""

import dataclasses

from peakmem.profiles import load_gpu, load_stack
from peakmem.profiles.loader import context_model

CALIBRATED_A100 = 1498415104  # torch-2.4, a100-40gb: fitted on the calibration split
EAGER = {"CUDA_MODULE_LOADING": "EAGER"}


def test_the_calibrated_a100_context_is_kept_whatever_the_loading():
    stack = load_stack("2.4.1")
    a100 = load_gpu("a100-40gb")
    assert stack.context_for(a100, {}).value == CALIBRATED_A100
    assert stack.context_for(a100, EAGER).value == CALIBRATED_A100


def test_lazy_loading_is_the_default_of_every_known_stack():
    for version in ("2.4.1", "2.5.1", "2.6.0"):
        stack = load_stack(version)
        assert stack.cuda_version >= (11, 7)
        assert stack.module_loading({}) == "lazy"
        context = stack.context_for(load_gpu("h100-80gb"), {})
        assert context.value == 400 * 2**20 and context.assumed
        assert "lazy module loading" in context.reason


def test_eager_loading_follows_the_architecture():
    stack = load_stack("2.6.0")
    assert stack.module_loading(EAGER) == "eager"
    volta = stack.context_for(load_gpu("v100-32gb"), EAGER)
    assert volta.value == 1343 * 2**20 and "V100" in volta.reason
    hopper = stack.context_for(load_gpu("h100-80gb"), EAGER)
    assert hopper.value == 667 * 2**20
    assert volta.assumed and hopper.assumed  # listed in the estimate's assumptions


def test_a_stack_before_cuda_11_7_loads_eagerly():
    old = dataclasses.replace(load_stack("2.4.1"), cuda_version=(11, 6))
    assert old.module_loading({}) == "eager"
    assert old.context_for(load_gpu("v100-32gb"), {}).value == 1343 * 2**20


def test_the_model_has_a_default_for_each_mode():
    gpu = load_gpu("rtx4090")
    assert context_model("lazy", gpu).value == 400 * 2**20
    assert context_model("eager", gpu).value == 667 * 2**20
    assert context_model("unknown", gpu) is None
