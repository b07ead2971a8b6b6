"""Sweep definitions (`benchmarks/sweeps/*.toml`) expanded into runs.

    name = "smoke"          # recorded in the CSV's `sweep` column
    steps = 3               # optimizer steps measured per run
    timeout = 240           # seconds per run

    [[group]]
    job = "benchmarks/zoo/vision.py"
    scale = "batch-size"    # the axis that does not make a new configuration (optional)
    snapshot = false        # dump an allocator snapshot per run (optional)
    fixed = { image-size = 224 }
    grid = { model = ["resnet18", "resnet50"], batch-size = [32, 64], precision = ["fp32", "bf16"] }
    env = { PYTORCH_CUDA_ALLOC_CONF = "expandable_segments:True" }   # optional

    [[run]]                 # an explicit run
    job = "benchmarks/zoo/gpumemnet.py"
    args = ["--config", "input:1259_output:79_depth:8_arch:pyramid_batch:717"]

Grid values become `--key value`; `true` becomes the bare flag `--key` and `false` drops it.
Within a group, runs come configuration by configuration with the scale axis ascending, so a
sweep can skip the larger sizes of a configuration that already ran out of memory.
"""

from __future__ import annotations

import itertools
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peakmem.measure.groundtruth import RunKey

Scalar = str | int | float | bool


class SweepError(ValueError):
    """The sweep definition is malformed."""


MAX_RUNS = 100_000
"""The most runs one sweep may define: a grid's product of axes grows past any machine's
memory long before a GPU could measure it (20 axes of 10 values: 1e20 runs)."""


def _steps(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000_000:
        raise SweepError(f"{where}: steps must be an integer from 1 to 1000000, got {value!r:.80}")
    return value


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not 0 < float(value) <= 7 * 86400:
        raise SweepError(f"{where}: timeout must be a number of seconds from 0 to 604800, got "
                         f"{value!r:.80}")
    return float(value)


def _number(value: Any, where: str) -> float:
    """A scale axis value: a finite number (TOML's dates, strings, nan and inf are not)."""
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or number != number or number in (float("inf"), float("-inf")):
        raise SweepError(f"{where}: scale values must be finite numbers, got {value!r:.80}")
    return number


@dataclass(frozen=True)
class PlannedRun:
    job: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    steps: int = 3
    timeout: float = 240.0
    config: str = ""  # job + args without the scale axis
    scale: float | None = None  # the value on the scale axis
    snapshot: bool = False
    group: int = 0

    @property
    def args_text(self) -> str:
        return shlex.join(self.args)

    @property
    def alloc_conf(self) -> str:
        env = dict(self.env)
        return env.get("PYTORCH_CUDA_ALLOC_CONF") or env.get("PYTORCH_ALLOC_CONF", "")

    @property
    def key(self) -> RunKey:
        return RunKey(self.job, self.args_text, self.alloc_conf, self.steps)

    def command(self) -> list[str]:
        return ["python", self.job, *self.args]


@dataclass
class SweepPlan:
    name: str
    runs: list[PlannedRun] = field(default_factory=list)

    @property
    def configs(self) -> set[str]:
        return {run.config for run in self.runs}


def _flag(key: str, value: Scalar) -> list[str]:
    option = key if key.startswith("-") else f"--{key}"
    if value is True:
        return [option]
    if value is False:
        return []
    return [option, str(value)]


def _env_of(table: dict[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    env = table.get("env", {})
    if not isinstance(env, dict):
        raise SweepError(f"{where}: env must be a table")
    return tuple(sorted((str(k), str(v)) for k, v in env.items()))


def _config_id(job: str, pairs: list[tuple[str, Scalar]], env: tuple, skip: str | None) -> str:
    args = [word for key, value in pairs if key != skip for word in _flag(key, value)]
    env_text = " ".join(f"{k}={v}" for k, v in env)
    return " ".join(part for part in (env_text, job, shlex.join(args)) if part)


def _expand_group(
    group: dict[str, Any], index: int, steps: int, timeout: float
) -> list[PlannedRun]:
    where = f"group {index + 1}"
    job = group.get("job")
    if not isinstance(job, str):
        raise SweepError(f"{where}: `job` (a script path) is required")
    fixed = group.get("fixed", {})
    grid = group.get("grid", {})
    if not isinstance(fixed, dict) or not isinstance(grid, dict):
        raise SweepError(f"{where}: fixed and grid must be tables")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}: grid.{key} must be a non-empty list")
    scale = group.get("scale")
    if scale is not None and scale not in grid:
        raise SweepError(f"{where}: scale axis {scale!r} is not in the grid")
    env = _env_of(group, where)
    keys = [k for k in grid if k != scale]
    scale_values = (sorted(grid[scale], key=lambda value: _number(value, where))
                    if scale is not None else [None])
    count = len(scale_values)
    for key in keys:
        count *= len(grid[key])
        if count > MAX_RUNS:
            raise SweepError(f"{where}: the grid defines more than {MAX_RUNS} runs")
    group_steps = _steps(group.get("steps", steps), where)
    group_timeout = _seconds(group.get("timeout", timeout), where)
    runs = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        for scale_value in scale_values:
            pairs: list[tuple[str, Scalar]] = list(fixed.items()) + list(
                zip(keys, combo, strict=True)
            )
            if scale is not None:
                pairs.append((scale, scale_value))
            args = tuple(word for key, value in pairs for word in _flag(key, value))
            runs.append(
                PlannedRun(
                    job=job,
                    args=args,
                    env=env,
                    steps=group_steps,
                    timeout=group_timeout,
                    config=_config_id(job, pairs, env, scale),
                    scale=float(scale_value) if scale_value is not None else None,
                    snapshot=bool(group.get("snapshot", False)),
                    group=index,
                )
            )
    return runs


def _explicit_run(entry: dict[str, Any], index: int, steps: int, timeout: float) -> PlannedRun:
    where = f"run {index + 1}"
    job, args = entry.get("job"), entry.get("args", [])
    if not isinstance(job, str) or not isinstance(args, list):
        raise SweepError(f"{where}: needs `job` (a path) and `args` (a list of strings)")
    env = _env_of(entry, where)
    words = tuple(str(a) for a in args)
    config = entry.get("config") or " ".join(
        part for part in (" ".join(f"{k}={v}" for k, v in env), job, shlex.join(words)) if part
    )
    return PlannedRun(
        job=job,
        args=words,
        env=env,
        steps=_steps(entry.get("steps", steps), where),
        timeout=_seconds(entry.get("timeout", timeout), where),
        config=str(config),
        snapshot=bool(entry.get("snapshot", False)),
        group=-1 - index,
    )


def load_plan(path: Path) -> SweepPlan:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SweepError(f"{path}: {exc}") from None
    return plan_from_dict(data, default_name=Path(path).stem)


def plan_from_dict(data: dict[str, Any], default_name: str = "sweep") -> SweepPlan:
    steps = _steps(data.get("steps", 3), "the sweep")
    timeout = _seconds(data.get("timeout", 240), "the sweep")
    plan = SweepPlan(name=str(data.get("name", default_name)))
    groups, entries = data.get("group", []), data.get("run", [])
    for name, tables in (("group", groups), ("run", entries)):
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise SweepError(f"`{name}` must be an array of tables ([[{name}]])")
    for index, group in enumerate(groups):
        plan.runs.extend(_expand_group(group, index, steps, timeout))
        if len(plan.runs) > MAX_RUNS:
            raise SweepError(f"the sweep defines more than {MAX_RUNS} runs")
    for index, entry in enumerate(entries):
        plan.runs.append(_explicit_run(entry, index, steps, timeout))
    if not plan.runs:
        raise SweepError("the sweep defines no runs (no [[group]] or [[run]] entries)")
    seen: set[RunKey] = set()
    unique = []
    for run in plan.runs:
        if run.key not in seen:
            seen.add(run.key)
            unique.append(run)
    plan.runs = unique
    return plan
