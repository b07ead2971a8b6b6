"""Multi-process launchers: what each rank of `torchrun ... train.py` would run, and with what
environment, without starting a launcher.

``peakmem estimate -- torchrun --nproc-per-node 8 train.py`` (or ``python -m torch.distributed.run``,
``python -m torch.distributed.launch``, ``accelerate launch``, ``deepspeed``, torchtune's
``tune run``, Lightning's ``fabric run``, TRL's ``trl sft`` and its other training commands) and
``peakmem estimate --nproc-per-node 8 [--nnodes 2] -- python train.py`` all become a
:class:`Launch`: the Python command one rank runs, the world's shape, and per rank the environment
the launcher gives it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
MASTER_PORT, TORCHELASTIC_*; accelerate's ACCELERATE_* / FSDP_*). Each launcher's own arguments
are parsed by a parser registered under its program or module name (:data:`LAUNCHERS`).

Nothing here imports torch or the launcher: parsing is by hand, from the launchers' documented
options (torch 2.13's ``torch.distributed.run``, accelerate 1.x ``launch``, deepspeed's runner).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from peakmem.jobs.command_wrappers import WrapperError, strip_wrappers
from peakmem.jobs.env_prefix import EnvPrefixError, split_env_prefix

APPEND_CWD_ENV = "PEAKMEM_SYS_PATH_APPEND_CWD"
"""Set to "1" for a job whose launcher appends the working directory to `sys.path` before it
runs the script in its own process (`tune run` on one device: "Make sure user code in current
directory is importable", torchtune `_cli/run.py`); jobs.runner.script_environment does it."""

DEFAULT_GPUS_PER_NODE = 8
"""What `--nproc-per-node gpu|auto` means here (the machine peakmem runs on has no GPU)."""
MAX_WORLD_SIZE = 1 << 16


class LaunchError(ValueError):
    """The launcher's command line cannot be run here (one line, for `bad_input` or
    `unsupported`)."""

    def __init__(self, message: str, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


@dataclass(frozen=True)
class Launch:
    """What one rank runs and the shape of the world it runs in."""

    command: tuple[str, ...]
    """`python script.py args` / `python -m module args`, as one rank runs it (without the
    per-rank arguments, see :meth:`rank_command`)."""
    nproc_per_node: int = 1
    nnodes: int = 1
    launcher: str = "python"
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the launcher sets for every rank besides the rank's own."""
    local_rank_argument: str | None = None
    """`--local_rank={n}` style argument the launcher appends for each rank (deepspeed,
    torch.distributed.launch without --use-env)."""
    notes: tuple[str, ...] = ()

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def distributed(self) -> bool:
        return self.launcher != "python" or self.world_size > 1

    def rank_command(self, rank: int) -> list[str]:
        """The command rank `rank` runs (with its `--local_rank=N` where the launcher adds it)."""
        command = list(self.command)
        if self.local_rank_argument is None:
            return command
        cut = 3 if command[1:2] == ["-m"] else 2
        local = rank % self.nproc_per_node
        return [*command[:cut], self.local_rank_argument.format(local), *command[cut:]]

    def rank_env(self, rank: int) -> dict[str, str]:
        """The variables torchrun's elastic agent gives global rank `rank` (plus the
        launcher's own)."""
        if not 0 <= rank < self.world_size:
            raise LaunchError(f"rank {rank} is not in a world of {self.world_size} rank(s)")
        local, node = rank % self.nproc_per_node, rank // self.nproc_per_node
        env = dict(self.env)
        env.update({
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.nproc_per_node),
            "GROUP_RANK": str(node),
            "GROUP_WORLD_SIZE": str(self.nnodes),
            "ROLE_RANK": str(rank),
            "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": str(self.world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        })
        if self.launcher == "deepspeed":
            env["CROSS_RANK"], env["CROSS_SIZE"] = str(node), str(self.nnodes)
            env["LOCAL_SIZE"] = str(self.nproc_per_node)
        return env

    def describe(self) -> dict[str, object]:
        """The launch as `--json` reports it."""
        return {"launcher": self.launcher, "world_size": self.world_size,
                "nproc_per_node": self.nproc_per_node, "nnodes": self.nnodes}


# -- option scanning ----------------------------------------------------------------------------


def _scan(words: Sequence[str], flags: frozenset[str], launcher: str,
          ) -> tuple[dict[str, str | bool], list[str]]:
    """Options before the script: name (dashes as `_`, no leading dashes) -> value (True for a
    flag), and the words from the script on. An option not in `flags` takes a value (the next
    word, or after `=`), unless the next word is the script (`*.py`)."""
    options: dict[str, str | bool] = {}
    index = 0
    while index < len(words):
        word = words[index]
        if word == "--":
            index += 1
            break
        if not word.startswith("-") or word == "-":
            break
        name, eq, value = word.partition("=")
        key = name.lstrip("-").replace("-", "_")
        if not key:
            raise LaunchError(f"{launcher}: cannot read option {word!r}")
        if eq:
            options[key] = value
        elif name in flags:
            options[key] = True
        elif index + 1 < len(words) and not words[index + 1].endswith(".py"):
            index += 1
            options[key] = words[index]
        else:
            options[key] = True
        index += 1
    return options, list(words[index:])


def _int(value: str | bool | None, what: str, launcher: str, default: int) -> int:
    if value is None or value is True:
        return default
    text = str(value).strip()
    try:
        number = int(text)
    except ValueError:
        raise LaunchError(f"{launcher}: {what} must be a whole number, got {text!r}") from None
    if not 1 <= number <= MAX_WORLD_SIZE:
        raise LaunchError(f"{launcher}: {what} must be between 1 and {MAX_WORLD_SIZE}, got {number}")
    return number


def _port(value: str | bool | None, launcher: str) -> int:
    if value is None or value is True:
        return 29500
    try:
        port = int(str(value))
    except ValueError:
        raise LaunchError(f"{launcher}: the master port must be a number, got {value!r}") from None
    return port if 0 < port < 65536 else 29500


def _script_command(rest: list[str], module: bool, launcher: str) -> tuple[str, ...]:
    if not rest:
        raise LaunchError(f"{launcher}: no training script given")
    if module:
        return ("python", "-m", *rest)
    if rest[0] in ("python", "python3") or Path(rest[0]).name.startswith("python"):
        raise LaunchError(f"{launcher}: give the training script, not {rest[0]!r} (the "
                          "launcher starts Python itself)")
    return ("python", *rest)


def _gpus(value: str | bool | None, launcher: str, notes: list[str]) -> int:
    if isinstance(value, str) and value.strip().lower() in ("gpu", "auto", "cuda"):
        notes.append(f"{launcher}: --nproc-per-node {value} assumed {DEFAULT_GPUS_PER_NODE} GPUs "
                     "per node; give a number to say how many")
        return DEFAULT_GPUS_PER_NODE
    if isinstance(value, str) and value.strip().lower() in ("cpu", "xpu"):
        raise LaunchError(f"{launcher}: --nproc-per-node {value} does not use GPUs",
                          unsupported=True)
    return _int(value, "--nproc-per-node", launcher, 1)


# -- launchers ----------------------------------------------------------------------------------

_TORCHRUN_FLAGS = frozenset({
    "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
    "--virtual-local-rank", "--virtual_local_rank",
    # torch.distributed.launch
    "--use-env", "--use_env",
})


def torchrun(words: Sequence[str], name: str = "torchrun") -> Launch:
    """`torchrun [options] script args` / `python -m torch.distributed.run ...`."""
    options, rest = _scan(words, _TORCHRUN_FLAGS, name)
    if options.get("no_python"):
        raise LaunchError(f"{name} --no-python runs a program that is not Python",
                          unsupported=True)
    notes: list[str] = []
    nnodes_text = str(options.get("nnodes", "1"))
    nnodes = _int(nnodes_text.split(":")[-1], "--nnodes", name, 1)
    if ":" in nnodes_text:
        notes.append(f"{name}: elastic --nnodes {nnodes_text}: the largest world ({nnodes} "
                     "nodes) was assumed")
    nproc = _gpus(options.get("nproc_per_node"), name, notes)
    addr = str(options.get("master_addr", "127.0.0.1"))
    local_rank_argument = None
    if name == "torch.distributed.launch" and not options.get("use_env"):
        local_rank_argument = "--local-rank={}"
    return Launch(_script_command(rest, bool(options.get("module") or options.get("m")), name),
                  nproc, nnodes, "torchrun", addr, _port(options.get("master_port"), name),
                  local_rank_argument=local_rank_argument, notes=tuple(notes))


def torch_distributed_launch(words: Sequence[str]) -> Launch:
    return torchrun(words, "torch.distributed.launch")


_DEEPSPEED_FLAGS = frozenset({
    "--module", "--no_python", "--no_local_rank", "--no_ssh", "--no_ssh_check", "--force_multi",
    "--save_pid", "--bind_cores_to_rank", "-q", "--quiet", "--autotuning_run",
})


def deepspeed(words: Sequence[str]) -> Launch:
    """`deepspeed [--num_gpus N] [--num_nodes M] script args`: the script also gets
    `--local_rank=N` (unless --no_local_rank)."""
    options, rest = _scan(words, _DEEPSPEED_FLAGS, "deepspeed")
    if options.get("no_python"):
        raise LaunchError("deepspeed --no_python runs a program that is not Python",
                          unsupported=True)
    notes: list[str] = []
    for option in ("hostfile", "H", "include", "i", "exclude", "e"):
        if option in options:
            notes.append(f"deepspeed: --{option} was not read: the world is --num_nodes x "
                         "--num_gpus")
    if "num_gpus" in options:
        gpus = _int(options["num_gpus"], "--num_gpus", "deepspeed", 1)
    else:
        gpus = DEFAULT_GPUS_PER_NODE
        notes.append(f"deepspeed: no --num_gpus: {gpus} GPUs per node assumed (all of a node's)")
    nodes = _int(options.get("num_nodes"), "--num_nodes", "deepspeed", 1)
    argument = None if options.get("no_local_rank") else "--local_rank={}"
    return Launch(_script_command(rest, bool(options.get("module")), "deepspeed"), gpus, nodes,
                  "deepspeed", str(options.get("master_addr", "127.0.0.1")),
                  _port(options.get("master_port"), "deepspeed"), local_rank_argument=argument,
                  notes=tuple(notes))


_ACCELERATE_FLAGS = frozenset({
    "--cpu", "--debug", "--downcast_bf16", "--dynamo_use_dynamic", "--dynamo_use_fullgraph",
    "--dynamo_use_regional_compilation", "--enable_cpu_affinity",
    "--fp8_use_autocast_during_eval", "--module", "-m", "--multi_gpu", "--no_python",
    "--no_tpu_cluster", "--quiet", "-q", "--same_network", "--tpu", "--tpu_cluster",
    "--tpu_use_sudo", "--use_deepspeed", "--use_fsdp", "--use_megatron_lm",
    "--use_parallelism_config",
})
_ACCELERATE_FSDP_ENV = {"fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP"}
_ACCELERATE_DEEPSPEED_ENV = {
    "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
}


def _accelerate_config(path: str | None) -> dict[str, object]:
    """accelerate's YAML or JSON config (the file named, or the default one), read as data."""
    if path is None:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface")
        default = Path(home) / "accelerate" / "default_config.yaml"
        if not default.is_file():
            return {}
        path = str(default)
    from peakmem.inputs import InputError, max_input_bytes, open_regular_file, read_capped

    try:  # a regular file under the input cap: /dev/zero or a FIFO would never end
        with open_regular_file(path) as handle:
            text = read_capped(handle, max_input_bytes(), path).decode("utf-8")
    except InputError as exc:
        raise LaunchError(f"accelerate launch: cannot read the config file {path!r} "
                          f"({exc.detail})") from None
    except UnicodeDecodeError:
        raise LaunchError(f"accelerate launch: cannot read the config file {path!r} "
                          "(not UTF-8 text)") from None
    try:
        if path.endswith(".json"):
            import json

            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - a malformed file, named in one line
        raise LaunchError(f"accelerate launch: cannot parse the config file {path!r} "
                          f"({type(exc).__name__})") from None
    return data if isinstance(data, dict) else {}


def accelerate(words: Sequence[str]) -> Launch:
    """`accelerate launch [options] script args` (accelerate's config file is read for what the
    options do not say)."""
    words = list(words)
    if not words or words[0] != "launch":
        raise LaunchError("accelerate: only `accelerate launch` starts a training job")
    options, rest = _scan(words[1:], _ACCELERATE_FLAGS, "accelerate launch")
    if options.get("no_python"):
        raise LaunchError("accelerate launch --no_python runs a program that is not Python",
                          unsupported=True)
    config = _accelerate_config(options.get("config_file") if isinstance(
        options.get("config_file"), str) else None)
    for key, value in config.items():  # the command line wins over the config file
        if isinstance(value, (str, int, float, bool)) and key not in options:
            options[key] = str(value).lower() if isinstance(value, bool) else str(value)
    notes: list[str] = []
    machines = _int(options.get("num_machines"), "--num_machines", "accelerate launch", 1)
    if "num_processes" in options:
        processes = _int(options["num_processes"], "--num_processes", "accelerate launch", 1)
    else:
        processes = DEFAULT_GPUS_PER_NODE * machines if options.get("multi_gpu") else 1
        if options.get("multi_gpu"):
            notes.append(f"accelerate launch: no --num_processes: {DEFAULT_GPUS_PER_NODE} GPUs "
                         "per machine assumed")
    per_node = max(1, processes // machines)
    distributed_type = str(options.get("distributed_type", "")).upper()
    env = {"ACCELERATE_MIXED_PRECISION": str(options.get("mixed_precision", "no")).lower()}
    if "gradient_accumulation_steps" in options:
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(options["gradient_accumulation_steps"])
    fsdp = options.get("use_fsdp") is True or distributed_type == "FSDP"
    if fsdp:
        env["ACCELERATE_USE_FSDP"] = "true"
        for key, value in options.items():
            if key.startswith("fsdp_") and value is not True:
                env[_ACCELERATE_FSDP_ENV.get(key, key.upper())] = str(value)
        nested = config.get("fsdp_config")
        if isinstance(nested, dict):
            for key, value in nested.items():
                name = _ACCELERATE_FSDP_ENV.get(key, key.upper())
                if key.startswith("fsdp_") and isinstance(value, (str, int, float, bool)):
                    env.setdefault(name, str(value).lower() if isinstance(value, bool) else str(value))
        # after the config file's `fsdp_version: 2` (it was set first, and the file's value lost)
        env.setdefault("FSDP_VERSION", "1")
    if options.get("use_deepspeed") is True or distributed_type == "DEEPSPEED":
        env["ACCELERATE_USE_DEEPSPEED"] = "true"
        for key, name in _ACCELERATE_DEEPSPEED_ENV.items():
            if key in options and options[key] is not True:
                env[name] = str(options[key])
        nested = config.get("deepspeed_config")
        if isinstance(nested, dict):
            for key, name in _ACCELERATE_DEEPSPEED_ENV.items():
                value = nested.get(key)
                if isinstance(value, (str, int, float)):
                    env.setdefault(name, str(value))
    if options.get("dynamo_backend"):
        env["ACCELERATE_DYNAMO_BACKEND"] = str(options["dynamo_backend"]).upper()
    command = _script_command(rest, bool(options.get("module") or options.get("m")),
                              "accelerate launch")
    return Launch(command, per_node, machines, "accelerate",
                  str(options.get("main_process_ip", "127.0.0.1")),
                  _port(options.get("main_process_port"), "accelerate launch"), env=env,
                  notes=tuple(notes))


def tune(words: Sequence[str]) -> Launch:
    """`tune run [torchrun options] RECIPE --config CFG [overrides]` (torchtune 0.6
    ``_cli/run.py``): a built-in recipe name runs its script from the installed torchtune, a
    built-in config name becomes its YAML file; any other recipe is a path run as a module
    (`my/recipe.py` -> `python -m my.recipe`) and any other config a file. Without torchrun
    options it is one process (`python RECIPE.py --config CFG ...`, as `tune run` runs it
    in-process); with them, a torchrun launch."""
    from peakmem.jobs.torchtune_recipes import builtin_config, builtin_recipes, torchtune_root

    words = list(words)
    if not words or words[0] != "run":
        raise LaunchError("tune: only `tune run` starts a training job")
    options, rest = _scan(words[1:], _TORCHRUN_FLAGS, "tune run")
    if not rest:
        raise LaunchError("tune run: no recipe given")
    recipe_name, recipe_args = rest[0], list(rest[1:])
    if "--config" not in recipe_args or recipe_args.index("--config") + 1 >= len(recipe_args):
        raise LaunchError("tune run: the '--config' argument is required")
    config_at = recipe_args.index("--config") + 1
    root = torchtune_root()
    recipe = builtin_recipes(root).get(recipe_name) if root is not None else None
    if recipe is None and not recipe_name.endswith(".py") and root is None:
        raise LaunchError(f"tune run: {recipe_name!r} is not a recipe file and torchtune is not "
                          "installed to look up its built-in recipes")
    if recipe is None and not recipe_name.endswith(".py"):
        raise LaunchError(f"tune run: {recipe_name!r} is neither a built-in torchtune recipe "
                          "nor a recipe file")
    config = builtin_config(root, recipe_args[config_at], recipe) if root is not None else None
    if config is not None:
        recipe_args[config_at] = str(config)
    script = [str(recipe.path)] if recipe is not None else [
        "--module", str(Path(recipe_name).with_suffix("")).replace("/", ".")]
    note = (f"tune run: recipe {recipe_name} ({script[-1]}), config {recipe_args[config_at]}")
    if options:  # any option before the recipe makes `tune run` a torchrun launch
        if recipe is not None and not recipe.supports_distributed:
            raise LaunchError(f"tune run: recipe {recipe_name} does not support distributed "
                              "training; run it without torchrun options")
        launch = torchrun([*words[1:len(words) - len(rest)], *script, *recipe_args], "tune run")
        return replace(launch, notes=(note, *launch.notes))
    command = ("python", *(["-m", script[1]] if recipe is None else script), *recipe_args)
    # `tune run` appends the cwd to sys.path and runs the recipe in its own process
    return Launch(command, 1, 1, "python", env={APPEND_CWD_ENV: "1"}, notes=(note,))


_FABRIC_ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")


def _fabric_devices(devices: str, launcher: str, notes: list[str]) -> int:
    """How many processes `fabric run --devices D` starts on one node (Lightning 2.x
    ``cli._get_num_processes`` with ``device_parser._normalize_parse_gpu_string_input``):
    `auto` is one device, `-1` all of the node's GPUs, `0,2` those devices, `N` the first N."""
    text = devices.strip()
    if text == "auto":
        return 1
    if text == "-1":
        notes.append(f"{launcher}: --devices -1 (all GPUs) assumed {DEFAULT_GPUS_PER_NODE} GPUs "
                     "per node; give a number to say how many")
        return DEFAULT_GPUS_PER_NODE
    if "," in text:
        ids = [part.strip() for part in text.split(",") if part.strip()]
        if not ids or not all(part.isdigit() for part in ids):
            raise LaunchError(f"{launcher}: --devices {devices!r} is not a list of GPU indices")
        if len(set(map(int, ids))) != len(ids):
            raise LaunchError(f"{launcher}: --devices {devices!r} names a GPU twice")
        return _int(str(len(ids)), "--devices", launcher, 1)
    if text in ("0", "[]"):
        raise LaunchError(f"{launcher}: --devices {devices} selects no GPU: the job would run on "
                          "the CPU", unsupported=True)
    return _int(text, "--devices", launcher, 1)


def fabric(words: Sequence[str], name: str = "fabric run") -> Launch:
    """`fabric run [options] script args` (Lightning 2.x ``lightning/fabric/cli.py``; also
    `python -m lightning.fabric.cli` and Lightning 2.0's `lightning run model`): the options
    become LT_* variables that `Fabric()` in the script reads (accelerator, strategy, devices,
    number of nodes, precision), then torchrun starts `--devices` processes a node (one for
    `--strategy dp`), master port 29400 by default."""
    options, rest = _scan(words, frozenset(), name)
    notes: list[str] = []
    accelerator = str(options.get("accelerator", "auto")).lower()
    if accelerator not in _FABRIC_ACCELERATORS:
        raise LaunchError(f"{name}: --accelerator {accelerator!r} is not one of "
                          f"{', '.join(_FABRIC_ACCELERATORS)}")
    if accelerator in ("cpu", "mps", "tpu"):
        raise LaunchError(f"{name}: --accelerator {accelerator} does not use CUDA GPUs",
                          unsupported=True)
    devices = str(options.get("devices", "1"))
    strategy = options.get("strategy")
    processes = 1 if strategy == "dp" else _fabric_devices(devices, name, notes)
    nodes = _int(options.get("num_nodes"), "--num-nodes", name, 1)
    env = {"LT_CLI_USED": "1", "LT_DEVICES": devices, "LT_NUM_NODES": str(nodes)}
    if "accelerator" in options:
        env["LT_ACCELERATOR"] = accelerator
    for option, variable in (("strategy", "LT_STRATEGY"), ("precision", "LT_PRECISION")):
        if isinstance(options.get(option), str):
            env[variable] = str(options[option])
    port = _port(options.get("main_port", "29400"), name)
    return Launch(_script_command(rest, False, name), processes, nodes, "fabric",
                  str(options.get("main_address", "127.0.0.1")), port, env=env, notes=tuple(notes))


def fabric_cli(words: Sequence[str]) -> Launch:
    """`fabric run ...` (the console script's group: `run` is the only training command)."""
    words = list(words)
    if not words or words[0] != "run":
        raise LaunchError("fabric: only `fabric run` starts a training job")
    return fabric(words[1:])


def lightning_cli(words: Sequence[str]) -> Launch:
    """Lightning 2.0's `lightning run model ...`, the same launcher as `fabric run`."""
    words = list(words)
    if words[:2] != ["run", "model"]:
        raise LaunchError("lightning: only `lightning run model` starts a training job")
    return fabric(words[2:], "lightning run model")


_TRL_COMMANDS = ("distillation", "dpo", "grpo", "kto", "reward", "rloo", "sft")
"""TRL 1.x's training commands (`trl/cli/commands/__init__.py`): each runs trl/scripts/NAME.py."""
_TRL_LAUNCH_VALUES = frozenset({
    "--num_processes", "--num_machines", "--machine_rank", "--main_process_ip",
    "--main_process_port", "--config_file", "--mixed_precision", "--zero_stage",
    "--deepspeed_config_file", "--offload_optimizer_device", "--offload_param_device",
    "--dynamo_backend", "--gpu_ids", "--num_cpu_threads_per_process", "--rdzv_backend",
})
_TRL_LAUNCH_FLAGS = frozenset({"--multi_gpu", "--use_deepspeed", "--use_fsdp", "--same_network"})
"""The `accelerate launch` options among a TRL command's words (the script's TrlParser does not
know them, so `trl` hands them to accelerate); every other word is the script's."""


def _trl_root() -> Path | None:
    """The installed trl package's folder (found, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("trl")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


def trl(words: Sequence[str]) -> Launch:
    """`trl sft|dpo|grpo|kto|reward|rloo|distillation ARGS` (TRL 1.x ``trl/cli``): `accelerate
    launch [its options] trl/scripts/NAME.py [the script's args]`. The words the script's
    parser does not know go to accelerate (its launch options, `--accelerate_config NAME`
    read as trl/accelerate_configs/NAME.yaml); the others, in order, to the script."""
    words = list(words)
    if not words or words[0] not in _TRL_COMMANDS:
        raise LaunchError(f"trl: only {' / '.join(_TRL_COMMANDS)} start a training job",
                          unsupported=bool(words) and words[0] in ("env", "vllm-serve"))
    root = _trl_root()
    script = root / "scripts" / f"{words[0]}.py" if root is not None else None
    if script is None or not script.is_file():
        raise LaunchError(f"trl {words[0]}: trl is not installed (no trl/scripts/{words[0]}.py)")
    launch_args: list[str] = []
    script_args: list[str] = []
    index = 1
    while index < len(words):
        word = words[index]
        name, eq, value = word.partition("=")
        if name == "--accelerate_config":
            value = value if eq else (words[index + 1] if index + 1 < len(words) else "")
            index += 1 if eq else 2
            config = Path(value) if Path(value).is_file() else root / "accelerate_configs" / f"{value}.yaml"
            launch_args += ["--config_file", str(config)]
            continue
        if name in _TRL_LAUNCH_VALUES and not eq and index + 1 < len(words):
            launch_args += [word, words[index + 1]]
            index += 2
            continue
        (launch_args if name in _TRL_LAUNCH_VALUES | _TRL_LAUNCH_FLAGS else script_args).append(word)
        index += 1
    launch = accelerate(["launch", *launch_args, str(script), *script_args])
    note = f"trl {words[0]}: {script} under accelerate launch"
    return replace(launch, launcher="trl", notes=(note, *launch.notes))


LauncherParser = Callable[[Sequence[str]], Launch]
LAUNCHERS: dict[str, LauncherParser] = {
    "torchrun": torchrun,
    "torch.distributed.run": torchrun,
    "torch.distributed.launch": torch_distributed_launch,
    "accelerate": accelerate,
    "accelerate.commands.launch": lambda words: accelerate(["launch", *words]),
    "accelerate.commands.accelerate_cli": accelerate,
    "deepspeed": deepspeed,
    "deepspeed.launcher.runner": deepspeed,
    "tune": tune,
    "torchtune._cli.tune": tune,
    "fabric": fabric_cli,
    "lightning.fabric.cli": fabric,  # its __main__ runs the `run` command itself
    "lightning": lightning_cli,
    "trl": trl,
    "trl.cli.main": trl,  # its __main__ runs the CLI (trl.cli has none)
}
"""Program (or `python -m` module) name -> the parser of the words after it."""


def _launcher_of(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(launcher name, the words after it) when `argv` starts a launcher."""
    words = list(argv)
    if not words:
        return None
    program = Path(words[0]).name
    if program in LAUNCHERS and program not in ("torch.distributed.run",):
        return program, words[1:]
    if program in ("python", "python3") or program.startswith("python3."):
        from peakmem.jobs.runner import skip_interpreter_options  # torch-free

        rest = skip_interpreter_options(words[1:])  # `python -W ignore -m torch.distributed.run`
        if len(rest) >= 2 and rest[0] == "-m" and rest[1] in LAUNCHERS:
            return rest[1], rest[2:]
    return None


def parse_launch(argv: Sequence[str], nproc_per_node: int | None = None,
                 nnodes: int | None = None) -> Launch | None:
    """The launch `argv` describes; None for a plain `python train.py` without
    `nproc_per_node`/`nnodes` (one process, no distributed environment). An environment prefix
    (`env NAME=VALUE ...`, `NAME=VALUE ...`, see :mod:`peakmem.jobs.env_prefix`) and wrapper
    programs (`nohup`, `time`, `nice -n 5`, see :mod:`peakmem.jobs.command_wrappers`) are taken
    off here, for every front end: the prefix's variables are the Launch's `env` (a plain
    `python train.py` after a prefix or wrapper gives a Launch whose `distributed` is False).

    `nproc_per_node` / `nnodes` (peakmem's own options) override the launcher's. A launcher
    that runs one process in place (`tune run` without torchrun options) gives a Launch whose
    `distributed` is False: its `command` is the job."""
    for value, what in ((nproc_per_node, "--nproc-per-node"), (nnodes, "--nnodes")):
        if value is not None and not 1 <= value <= MAX_WORLD_SIZE:
            raise LaunchError(f"{what} must be between 1 and {MAX_WORLD_SIZE}, got {value}")
    given = tuple(argv)
    argv, variables = _job_of(argv)
    _check_visible_devices(variables)
    found = _launcher_of(argv)
    if found is None:
        if nproc_per_node is None and nnodes is None:
            changed = variables or argv != given  # a prefix or a wrapper was taken off
            return Launch(tuple(argv), env=variables) if changed else None
        return Launch(tuple(argv), nproc_per_node or 1, nnodes or 1, "torchrun", env=variables)
    name, words = found
    launch = LAUNCHERS[name](words)
    if variables:  # the prefix's variables reach every rank; the launcher's own win
        launch = replace(launch, env={**variables, **launch.env})
    if nproc_per_node is not None or nnodes is not None:
        launch = replace(launch, nproc_per_node=nproc_per_node or launch.nproc_per_node,
                         nnodes=nnodes or launch.nnodes,
                         launcher="torchrun" if launch.launcher == "python" else launch.launcher)
    return launch


def _job_of(argv: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """The command after any environment prefixes and wrappers (`env A=1 nohup nice -n 5
    python t.py`), and the variables the prefixes set."""
    command, variables = tuple(argv), {}
    wrappers: tuple[str, ...] = ()
    while True:
        if wrappers and command and "=" in command[0] and not command[0].startswith("-"):
            raise LaunchError(f"`{wrappers[-1]}` would run a program named {command[0]!r}: "
                              f"write `{wrappers[-1]} env {command[0]} ...`")
        try:
            command, more = split_env_prefix(command)
            command, wrappers = strip_wrappers(command)
        except (EnvPrefixError, WrapperError) as exc:
            raise LaunchError(str(exc)) from None
        variables.update(more)
        if not more and not wrappers:
            return command, variables


def _check_visible_devices(variables: Mapping[str, str]) -> None:
    """A prefix whose CUDA_VISIBLE_DEVICES hides every GPU (`CUDA_VISIBLE_DEVICES=`, `=-1`)
    makes the job run on the CPU: there is no GPU memory to estimate (peakmem's own environment
    is not the job's: only the command's prefix is read)."""
    value = variables.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return
    if not visible_devices(value):
        shown = value if len(value) <= 60 else value[:57] + "..."
        raise LaunchError(f"the command sets CUDA_VISIBLE_DEVICES={shown!r}, which hides every "
                          "GPU: the job would run on the CPU and use no GPU memory")


def visible_devices(value: str) -> list[int] | list[str]:
    """The devices a CUDA_VISIBLE_DEVICES of `value` leaves visible, read as torch reads it
    (`torch.cuda._parse_visible_devices`): GPU-/MIG- UUIDs up to the first other entry; else
    ordinals as strtoul reads them (`1gpu` is 1) up to the first that is not one (`abc`, `-1`,
    empty), none at all when one repeats (`0,0`)."""
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            uuids: list[str] = []
            for entry in value.split(","):
                if entry in uuids:
                    return []
                if not entry.startswith(prefix):
                    break
                uuids.append(entry)
            return uuids
    ordinals: list[int] = []
    for entry in value.split(","):
        ordinal = _leading_ordinal(entry.strip())
        if ordinal in ordinals:
            return []
        if ordinal < 0:
            break
        ordinals.append(ordinal)
    return ordinals


def _leading_ordinal(text: str) -> int:
    """The integer `text` starts with (a sign allowed first); -1 when it starts with none."""
    sign = text[:1] if text[:1] in ("+", "-") else ""
    body = text[len(sign):]
    digits = len(body) - len(body.lstrip("0123456789"))
    return int(sign + body[:digits]) if digits else -1


def job_command(argv: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the command one process runs, the variables of its environment prefix) for a front end
    that checks or runs a single command (the service's request check, `peakmem measure`): a
    launcher's command is its rank 0's. LaunchError for a command that cannot be read."""
    launch = parse_launch(argv)
    if launch is None:
        return tuple(argv), {}
    return tuple(launch.rank_command(0)), dict(launch.env)


def parse_ranks(text: str | None, world_size: int) -> list[int]:
    """`--ranks`: None -> [0]; "all" -> every rank; "0,3,5-7" -> those ranks."""
    if text is None:
        return [0]
    text = text.strip().lower()
    if text == "all":
        return list(range(world_size))
    ranks: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        try:
            low = int(first)
            high = int(last) if dash else low
        except ValueError:
            raise LaunchError(f"--ranks: {part.strip()!r} is not a rank or a range of ranks "
                              "(e.g. all, 0, 0,3, 4-7)") from None
        if not 0 <= low <= high < world_size:
            raise LaunchError(f"--ranks: {part.strip()!r} is outside the world's ranks "
                              f"0-{world_size - 1}")
        ranks.update(range(low, high + 1))
    return sorted(ranks)
