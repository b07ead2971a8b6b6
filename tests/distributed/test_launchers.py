"""Launcher command lines -> what each rank runs and its environment (no torch, no processes)."""

import pytest

from peakmem.jobs.launchers import LaunchError, parse_launch, parse_ranks


@pytest.mark.parametrize("argv", [
    ["torchrun", "--nproc-per-node", "4", "train.py", "--lr", "1"],
    ["torchrun", "--nproc_per_node=4", "--standalone", "train.py", "--lr", "1"],
    ["/usr/bin/torchrun", "--nnodes=1", "--nproc-per-node=4", "--rdzv-backend", "c10d",
     "--rdzv-endpoint=localhost:0", "train.py", "--lr", "1"],
    ["python", "-m", "torch.distributed.run", "--nproc-per-node", "4", "train.py", "--lr", "1"],
    ["python3", "-u", "-m", "torch.distributed.run", "--nproc_per_node", "4", "train.py", "--lr",
     "1"],
    ["accelerate", "launch", "--num_processes", "4", "--multi_gpu", "train.py", "--lr", "1"],
    ["accelerate", "launch", "--multi_gpu", "--num_processes=4", "--mixed_precision", "bf16",
     "train.py", "--lr", "1"],
    ["python", "-m", "accelerate.commands.launch", "--num_processes", "4", "train.py", "--lr",
     "1"],
])
def test_four_ranks_of_train_py(argv):
    launch = parse_launch(argv)
    assert launch.world_size == 4 and launch.nnodes == 1
    assert launch.rank_command(2) == ["python", "train.py", "--lr", "1"]
    env = launch.rank_env(2)
    assert env["RANK"] == env["LOCAL_RANK"] == "2"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
    assert env["GROUP_RANK"] == "0" and env["MASTER_ADDR"] and env["MASTER_PORT"].isdigit()


def test_nodes_and_ranks():
    launch = parse_launch(["torchrun", "--nnodes", "1:2", "--nproc-per-node", "8", "-m",
                           "pkg.train", "x"])
    assert launch.world_size == 16 and launch.rank_command(0) == ["python", "-m", "pkg.train", "x"]
    env = launch.rank_env(13)
    assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == ("13", "5", "1")
    assert any("largest world" in note for note in launch.notes)
    with pytest.raises(LaunchError):
        launch.rank_env(16)


def test_peakmem_options_make_a_plain_command_distributed_and_override():
    assert parse_launch(["python", "train.py"]) is None
    launch = parse_launch(["python", "train.py", "a"], nproc_per_node=2, nnodes=3)
    assert launch.world_size == 6 and launch.rank_command(5) == ["python", "train.py", "a"]
    assert parse_launch(["torchrun", "--nproc-per-node", "8", "t.py"], nproc_per_node=2
                        ).world_size == 2


def test_deepspeed_passes_local_rank():
    launch = parse_launch(["deepspeed", "--num_gpus", "2", "--num_nodes", "2", "train.py",
                           "--deepspeed_config", "ds.json"])
    assert launch.world_size == 4 and launch.launcher == "deepspeed"
    assert launch.rank_command(3) == ["python", "train.py", "--local_rank=1",
                                      "--deepspeed_config", "ds.json"]
    no_arg = parse_launch(["deepspeed", "--num_gpus=2", "--no_local_rank", "train.py"])
    assert no_arg.rank_command(1) == ["python", "train.py"]
    assumed = parse_launch(["deepspeed", "train.py"])
    assert assumed.world_size == 8 and assumed.notes


def test_torch_distributed_launch_local_rank_argument():
    launch = parse_launch(["python", "-m", "torch.distributed.launch", "--nproc_per_node", "2",
                           "t.py", "a"])
    assert launch.rank_command(1) == ["python", "t.py", "--local-rank=1", "a"]
    env_only = parse_launch(["python", "-m", "torch.distributed.launch", "--use-env",
                             "--nproc_per_node", "2", "t.py"])
    assert env_only.rank_command(1) == ["python", "t.py"]


def test_accelerate_environment(tmp_path):
    config = tmp_path / "fsdp.yaml"
    config.write_text("distributed_type: FSDP\nnum_processes: 2\nmixed_precision: bf16\n"
                      "fsdp_config:\n  fsdp_sharding_strategy: FULL_SHARD\n"
                      "  fsdp_offload_params: false\n")
    launch = parse_launch(["accelerate", "launch", "--config_file", str(config), "train.py"])
    env = launch.rank_env(1)
    assert launch.world_size == 2 and launch.launcher == "accelerate"
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert env["ACCELERATE_USE_FSDP"] == "true"
    assert env["FSDP_SHARDING_STRATEGY"] == "FULL_SHARD" and env["FSDP_OFFLOAD_PARAMS"] == "false"
    deepspeed = parse_launch(["accelerate", "launch", "--use_deepspeed", "--zero_stage", "2",
                              "--num_processes", "2", "train.py"])
    assert deepspeed.rank_env(0)["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"


def test_accelerate_fsdp_version_from_the_config_file(tmp_path):
    """`fsdp_version: 2` in the config file's fsdp_config reaches accelerate (FSDP_VERSION); FSDP1
    only where neither the file nor `--fsdp_version` says."""
    config = tmp_path / "fsdp2.yaml"
    config.write_text("distributed_type: FSDP\nnum_processes: 2\n"
                      "fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n")
    launch = parse_launch(["accelerate", "launch", "--config_file", str(config), "train.py"])
    assert launch.rank_env(0)["FSDP_VERSION"] == "2"
    assert launch.rank_env(0)["FSDP_RESHARD_AFTER_FORWARD"] == "true"
    flag = parse_launch(["accelerate", "launch", "--use_fsdp", "--fsdp_version", "2",
                         "--num_processes", "2", "train.py"])
    assert flag.rank_env(0)["FSDP_VERSION"] == "2"
    plain = parse_launch(["accelerate", "launch", "--use_fsdp", "--num_processes", "2", "train.py"])
    assert plain.rank_env(0)["FSDP_VERSION"] == "1"


@pytest.mark.skipif(__import__("importlib").util.find_spec("trl") is None, reason="needs trl")
def test_trl_training_commands_are_accelerate_launches_of_trls_scripts():
    """`trl sft ARGS` (TRL 1.x trl/cli): `accelerate launch [the words TrlParser does not know]
    trl/scripts/sft.py [the others, in order]`; `--accelerate_config NAME` is TRL's own
    trl/accelerate_configs/NAME.yaml."""
    from peakmem.jobs.launchers import _trl_root

    script = _trl_root() / "scripts" / "sft.py"
    launch = parse_launch(["trl", "sft", "--model_name_or_path", "m", "--num_processes", "2",
                           "--max_steps", "3", "--mixed_precision=bf16", "--multi_gpu",
                           "--output_dir", "out"])
    assert launch.launcher == "trl" and launch.world_size == 2 and launch.distributed
    assert launch.rank_command(1) == ["python", str(script), "--model_name_or_path", "m",
                                      "--max_steps", "3", "--output_dir", "out"]
    assert launch.rank_env(1)["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert launch.notes[0] == f"trl sft: {script} under accelerate launch"
    # one process without launch options; TRL's multi_gpu config says 8 processes, bf16
    assert parse_launch(["trl", "dpo", "--dataset_name", "d"]).world_size == 1
    configured = parse_launch(["python", "-m", "trl.cli.main", "grpo", "--accelerate_config",
                               "multi_gpu", "--model_name_or_path", "m"])
    assert configured.world_size == 8 and configured.rank_env(0)["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert configured.rank_command(0) == ["python", str(script.with_name("grpo.py")),
                                          "--model_name_or_path", "m"]


@pytest.mark.parametrize(("argv", "unsupported"), [
    (["torchrun", "--nproc-per-node", "4"], False),  # no script
    (["torchrun", "--nproc-per-node", "four", "t.py"], False),
    (["torchrun", "--nproc-per-node", "0", "t.py"], False),
    (["torchrun", "--nproc-per-node", "99999999", "t.py"], False),
    (["torchrun", "--no-python", "--nproc-per-node", "2", "./a.out"], True),
    (["torchrun", "--nproc-per-node", "cpu", "t.py"], True),
    (["torchrun", "python", "t.py"], False),
    (["accelerate", "config"], False),
    (["accelerate", "launch", "--config_file", "/nonexistent.yaml", "t.py"], False),
    (["deepspeed", "--num_gpus", "-3", "t.py"], False),
    (["fabric", "consolidate", "ckpt"], False),
    (["fabric", "run", "--accelerator", "cpu", "--devices", "2", "t.py"], True),
    (["fabric", "run", "--accelerator", "tpu", "t.py"], True),
    (["fabric", "run", "--accelerator", "rocm", "t.py"], False),
    (["fabric", "run", "--devices", "0", "t.py"], True),
    (["fabric", "run", "--devices", "0,0", "t.py"], False),
    (["fabric", "run", "--devices", "a,b", "t.py"], False),
    (["fabric", "run", "--accelerator", "cuda"], False),
    (["lightning", "run", "app", "app.py"], False),
    (["trl", "chat", "--model_name_or_path", "m"], False),
    (["trl", "vllm-serve", "--model", "m"], True),
    (["trl"], False),
])
def test_bad_launches_are_one_line_errors(argv, unsupported):
    with pytest.raises(LaunchError) as caught:
        parse_launch(argv)
    assert caught.value.unsupported is unsupported
    assert "\n" not in str(caught.value)


def test_malformed_accelerate_config_is_refused(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("a: [unclosed\n  - {")
    with pytest.raises(LaunchError, match="cannot parse"):
        parse_launch(["accelerate", "launch", "--config_file", str(config), "t.py"])
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(LaunchError, match="cannot parse"):
        parse_launch(["accelerate", "launch", "--config_file", str(hostile), "t.py"])


def test_ranks_option():
    assert parse_ranks(None, 8) == [0]
    assert parse_ranks("all", 3) == [0, 1, 2]
    assert parse_ranks("0,3,5-6", 8) == [0, 3, 5, 6]
    for bad in ("8", "x", "3-1", "-1", "0,,1"):
        with pytest.raises(LaunchError):
            parse_ranks(bad, 8)


def test_tune_run_of_a_recipe_file_is_one_process_running_it_as_a_module():
    # a recipe given as a path runs as a module (torchtune 0.6's `tune run`); no torchtune needed
    for argv in (["tune", "run", "recipes/my_lora.py", "--config", "cfg.yaml", "epochs=1"],
                 ["python", "-m", "torchtune._cli.tune", "run", "recipes/my_lora.py", "--config",
                  "cfg.yaml", "epochs=1"]):
        launch = parse_launch(argv)
        assert not launch.distributed and launch.world_size == 1
        assert launch.command == ("python", "-m", "recipes.my_lora", "--config", "cfg.yaml",
                                  "epochs=1")
        assert launch.notes == ("tune run: recipe recipes/my_lora.py (recipes.my_lora), config "
                                "cfg.yaml",)


def test_peakmems_own_process_count_makes_a_tune_run_a_torchrun_launch():
    launch = parse_launch(["tune", "run", "my_lora.py", "--config", "cfg.yaml"], nproc_per_node=2)
    assert launch.distributed and launch.launcher == "torchrun" and launch.world_size == 2


def test_ranks_need_a_distributed_launch_even_through_tune_run():
    from peakmem.estimate.api import EstimateError
    from peakmem.estimate.distributed import launch_for

    with pytest.raises(EstimateError, match="--ranks needs a distributed launch"):
        launch_for(["tune", "run", "my_lora.py", "--config", "cfg.yaml"], ranks="all")


def test_fabric_run_is_torchrun_with_the_lightning_variables():
    """`fabric run` (Lightning 2.x fabric/cli.py): the options become LT_* variables Fabric()
    reads, then torchrun starts --devices processes a node, master port 29400."""
    launch = parse_launch(["fabric", "run", "--accelerator", "cuda", "--devices", "2",
                           "--strategy", "ddp", "--precision", "bf16-mixed", "--num-nodes", "2",
                           "train.py", "--epochs", "3"])
    assert launch.launcher == "fabric" and (launch.nproc_per_node, launch.nnodes) == (2, 2)
    assert launch.rank_command(3) == ["python", "train.py", "--epochs", "3"]
    env = launch.rank_env(3)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]) == (
        "3", "1", "4", "29400")
    assert {key: env[key] for key in env if key.startswith("LT_")} == {
        "LT_CLI_USED": "1", "LT_ACCELERATOR": "cuda", "LT_DEVICES": "2", "LT_NUM_NODES": "2",
        "LT_STRATEGY": "ddp", "LT_PRECISION": "bf16-mixed"}
    # without options: one device, no accelerator or precision variable (Fabric's defaults)
    plain = parse_launch(["/usr/local/bin/fabric", "run", "train.py"])
    assert plain.world_size == 1 and plain.distributed
    assert "LT_ACCELERATOR" not in plain.env and plain.env["LT_DEVICES"] == "1"


@pytest.mark.parametrize(("devices", "processes"), [
    ("3", 3), ("0,2", 2), ("1,", 1), ("auto", 1), ("-1", 8)])
def test_fabric_run_devices_as_lightning_parses_them(devices, processes):
    launch = parse_launch(["fabric", "run", f"--devices={devices}", "train.py"])
    assert launch.nproc_per_node == processes
    assert launch.rank_env(0)["LT_DEVICES"] == devices
    assert bool(launch.notes) is (devices == "-1")  # all GPUs: a node of 8 assumed


def test_fabric_run_other_spellings():
    # dp: one process driving every device
    assert parse_launch(["fabric", "run", "--strategy", "dp", "--devices", "4", "t.py"]
                        ).world_size == 1
    # the module's own __main__ is the `run` command; Lightning 2.0's `lightning run model`
    for argv in (["python", "-m", "lightning.fabric.cli", "--devices", "2", "t.py", "x"],
                 ["lightning", "run", "model", "--devices=2", "--main_port", "1234", "t.py", "x"]):
        launch = parse_launch(argv)
        assert launch.world_size == 2 and launch.rank_command(1) == ["python", "t.py", "x"]
    assert parse_launch(["lightning", "run", "model", "--main_port", "1234", "t.py"]
                        ).master_port == 1234
