"""torchtune's own recipes under `peakmem estimate -- tune run RECIPE --config CFG`, end to end:
the `tune` launcher resolves the built-in recipe script from the installed torchtune, which loads
a tiny local Llama 3.2 checkpoint (tests/capture/torchtune_assets.py) and trains 3 steps."""

import pytest

from peakmem.estimate import estimate_command
from peakmem.jobs.launchers import LaunchError, parse_launch
from tests.capture.torchtune_assets import tiny_llama
from tests.capture.torchtune_env import torchtune_pythonpath, with_torchtune_path

TORCHTUNE_PATH = torchtune_pythonpath()  # skips the module where torchtune cannot run

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def estimates(llama):
    with pytest.MonkeyPatch.context() as patch:
        with_torchtune_path(patch, TORCHTUNE_PATH)
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_DATASETS_CACHE", str(llama.root / "datasets_cache"))
        patch.chdir(llama.root)
        return {name: estimate_command(["tune", "run", recipe, "--config", str(config)], **GPU)
                for name, recipe, config in (
                    ("lora", "lora_finetune_single_device", llama.lora_config),
                    ("full", "full_finetune_single_device", llama.full_config))}


def test_a_builtin_recipe_resolves_to_its_script_in_the_installed_torchtune(llama):
    launch = parse_launch(["tune", "run", "lora_finetune_single_device", "--config",
                           str(llama.lora_config), "batch_size=2"])
    assert launch is not None and not launch.distributed
    assert launch.command[0] == "python"
    assert launch.command[1].endswith("/recipes/lora_finetune_single_device.py")
    assert launch.command[2:] == ("--config", str(llama.lora_config), "batch_size=2")


def test_a_builtin_config_name_becomes_its_yaml_file():
    launch = parse_launch(["tune", "run", "lora_finetune_single_device", "--config",
                           "llama3_2/1B_lora_single_device"])
    assert launch.command[3].endswith("/recipes/configs/llama3_2/1B_lora_single_device.yaml")


def test_torchrun_options_make_tune_run_a_torchrun_launch():
    launch = parse_launch(["tune", "run", "--nproc_per_node", "4", "lora_finetune_distributed",
                           "--config", "llama3_2/1B_lora"])
    assert launch.distributed and launch.launcher == "torchrun" and launch.world_size == 4
    assert launch.command[1].endswith("/recipes/lora_finetune_distributed.py")
    custom = parse_launch(["tune", "run", "--nproc_per_node", "2", "my_recipes/train.py",
                           "--config", "cfg.yaml"])
    assert custom.command[:3] == ("python", "-m", "my_recipes.train")


def test_tune_run_needs_a_config_and_a_recipe_that_supports_distributed():
    with pytest.raises(LaunchError, match="'--config' argument is required"):
        parse_launch(["tune", "run", "lora_finetune_single_device"])
    with pytest.raises(LaunchError, match="does not support distributed"):
        parse_launch(["tune", "run", "--nproc_per_node", "2", "lora_finetune_single_device",
                      "--config", "x.yaml"])
    with pytest.raises(LaunchError, match="only `tune run`"):
        parse_launch(["tune", "download", "meta-llama/Llama-3.2-1B"])


def test_the_lora_and_full_recipes_estimate_end_to_end(estimates):
    for name, result in estimates.items():
        assert result.steps == 3, name
        assert result.estimate_kind == "training", name
        assert result.notes[0].startswith(f"tune run: recipe {name}_finetune_single_device"), name


def test_lora_trains_a_few_adapters_and_peaks_below_full_finetuning(estimates):
    lora, full = estimates["lora"].breakdown.by_category, estimates["full"].breakdown.by_category
    # full fine-tuning: AdamW's two bf16 moments for every bf16 weight (plus fp32 step scalars)
    assert 2 * full["parameter"] <= full["optimizer_state"] <= 2 * full["parameter"] + 64 * 512
    # LoRA: moments only for the q/v adapters, a small fraction of the model
    assert lora["optimizer_state"] < full["optimizer_state"] / 10
    assert estimates["lora"].peak_allocated_bytes < estimates["full"].peak_allocated_bytes
