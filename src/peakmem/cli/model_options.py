"""`peakmem estimate --model CONFIG [--task ...] [--print-script]`: estimate a standard training
script built for a transformers config instead of a command (`peakmem.scriptgen`)."""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from peakmem.scriptgen.template import OPTIMIZERS, PRECISIONS, TASKS

MODEL_OPTION_NAMES = ("model", "task", "batch", "seq", "precision", "optimizer", "lora_rank",
                      "gradient_checkpointing", "print_script")


def model_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The `--model` options, added to a click command (they arrive as keyword arguments named
    in MODEL_OPTION_NAMES)."""
    options = [
        click.option("--model", default=None, metavar="CONFIG",
                     help="No script? A transformers config.json, model directory or Hub id (from "
                     "the local HF cache): estimate a standard training script for it."),
        click.option("--task", type=click.Choice(list(TASKS)), default="causal-lm",
                     show_default=True, help="--model: what the script trains."),
        click.option("--batch", type=click.IntRange(1, 2**24), default=1, show_default=True,
                     help="--model: sequences per batch."),
        click.option("--seq", type=click.IntRange(1, 2**24), default=512, show_default=True,
                     help="--model: tokens per sequence."),
        click.option("--precision", type=click.Choice(list(PRECISIONS)), default="amp-bf16",
                     show_default=True, help="--model: weights dtype, or fp32 weights under "
                     "autocast (amp-*)."),
        click.option("--optimizer", type=click.Choice(list(OPTIMIZERS)), default="adamw",
                     show_default=True, help="--model: the optimizer."),
        click.option("--lora-rank", type=click.IntRange(1, 65536), default=None,
                     help="--model: train LoRA adapters of this rank (peft) on every linear layer "
                     "instead of all weights."),
        click.option("--gradient-checkpointing", is_flag=True,
                     help="--model: recompute activations in the backward pass."),
        click.option("--print-script", is_flag=True,
                     help="--model: print the training script (to start from) instead of "
                     "estimating it."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def model_command(command: tuple[str, ...], settings: dict[str, Any]) -> tuple[str, ...]:
    """The job's command: `command` itself, or with --model a generated script (written to a
    temporary directory removed at exit). `--print-script` prints the script and exits 0.
    Raises ValueError (one line: bad input) for --model with a command, neither, or a config
    that cannot be used (what only transformers can check is checked in the job, whose
    process imports it: scriptgen.config_check; here with --print-script)."""
    from peakmem.scriptgen import ConfigError, TrainingSpec, find_config, render_script

    source = settings.get("model")
    if source is None:
        used = [f"--{name.replace('_', '-')}" for name in ("lora_rank", "print_script",
                                                           "gradient_checkpointing")
                if settings.get(name)]
        if used:
            raise ValueError(f"{', '.join(used)} go with --model CONFIG")
        if not command:
            raise ValueError("give the job's command after `--` (e.g. -- python train.py), "
                             "or --model CONFIG")
        return command
    if command:
        raise ValueError("give either --model CONFIG or a command after `--`, not both")
    spec = TrainingSpec(
        task=settings["task"], batch=settings["batch"], seq=settings["seq"],
        precision=settings["precision"], optimizer=settings["optimizer"],
        lora_rank=settings.get("lora_rank"),
        gradient_checkpointing=bool(settings.get("gradient_checkpointing")),
    )
    try:
        spec.check()
        config, _where = find_config(source)  # transformers' own check runs in the job
        if settings.get("print_script"):  # no job: transformers' check here
            import contextlib

            from peakmem.scriptgen.config_check import built_config

            with contextlib.suppress(ImportError):  # a model module this process cannot
                # import (a CPU-only torch without torchvision's ops, which a job's declares)
                built_config(config, source)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if settings.get("print_script"):
        click.echo(render_script(spec, config, source), nl=False)
        sys.exit(0)
    script = render_script(spec, config, source, checked=True)
    folder = Path(tempfile.mkdtemp(prefix="peakmem-model-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "train_model.py"
    path.write_text(script, encoding="utf-8")
    return (sys.executable, str(path))
