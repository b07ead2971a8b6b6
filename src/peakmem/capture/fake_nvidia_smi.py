"""An `nvidia-smi` on the job's PATH that answers for the target GPU (--gpu).

Scripts ask nvidia-smi before they touch torch: to pick the least used GPU
(`nvidia-smi --query-gpu=memory.used --format=csv`), to size a batch from the free memory, or
just to log the device. Without a GPU the command is missing and the job dies with
FileNotFoundError; on a machine with some other GPU it would describe the wrong card. During a
capture the job finds this one first on its PATH: it describes an idle target GPU (no memory
used, nothing running), like nvidia-smi run before the job starts, once per local process of a
distributed launch (LOCAL_WORLD_SIZE).

The executable runs this file directly (standard library only, no torch, no package import),
so a call costs a bare Python start.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

COMMAND = "nvidia-smi"
DRIVER_VERSION = "550.54.15"
CUDA_VERSION = "12.4"


class Card:
    """One simulated GPU as nvidia-smi reports it."""

    def __init__(self, index: int, name: str, total_mib: int, compute_cap: str = "[N/A]",
                 driver: str = DRIVER_VERSION, cuda: str = CUDA_VERSION) -> None:
        self.index, self.name, self.total_mib = index, name, total_mib
        self.compute_cap = compute_cap
        self.driver, self.cuda = driver, cuda  # the stack profile's driver and its CUDA

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-0000-0000-0000-{self.index:012d}"

    @property
    def bus_id(self) -> str:
        return f"00000000:{self.index + 1:02X}:00.0"


def _mib(value: Callable[[Card], int]) -> tuple[Callable[[Card], str], str]:
    return (lambda card: str(value(card))), "MiB"


FIELDS: dict[str, tuple[Callable[[Card], str], str]] = {
    "index": (lambda card: str(card.index), ""),
    "name": (lambda card: card.name, ""),
    "gpu_name": (lambda card: card.name, ""),
    "uuid": (lambda card: card.uuid, ""),
    "gpu_uuid": (lambda card: card.uuid, ""),
    "pci.bus_id": (lambda card: card.bus_id, ""),
    "gpu_bus_id": (lambda card: card.bus_id, ""),
    "count": (lambda card: "", ""),  # filled in by the caller (the number of cards)
    "driver_version": (lambda card: card.driver, ""),
    "memory.total": _mib(lambda card: card.total_mib),
    "memory.used": _mib(lambda card: 0),
    "memory.reserved": _mib(lambda card: 0),
    "memory.free": _mib(lambda card: card.total_mib),
    "utilization.gpu": ((lambda card: "0"), "%"),
    "utilization.memory": ((lambda card: "0"), "%"),
    "temperature.gpu": ((lambda card: "30"), ""),
    "power.draw": ((lambda card: "50.00"), "W"),
    "compute_mode": ((lambda card: "Default"), ""),
    "compute_cap": ((lambda card: card.compute_cap), ""),
    "pstate": ((lambda card: "P0"), ""),
    "fan.speed": ((lambda card: "[N/A]"), "%"),
    "power.limit": ((lambda card: "[N/A]"), "W"),
    "gpu_serial": ((lambda card: f"{card.index:013d}"), ""),
    "serial": ((lambda card: f"{card.index:013d}"), ""),
    "display_active": ((lambda card: "Disabled"), ""),
    "display_mode": ((lambda card: "Disabled"), ""),
    "persistence_mode": ((lambda card: "Enabled"), ""),
}
"""--query-gpu fields answered (with their unit); any other field is refused as nvidia-smi
refuses an unknown one."""


def _option(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
            if arg == name and i + 1 < len(args):
                return args[i + 1]
    return None


def _query(cards: list[Card], fields: list[str], fmt: str, out: list[str], count: int) -> int:
    for field in fields:
        if field not in FIELDS:
            out.append(f'Field "{field}" is not a valid field to query.')
            return 2
    options = {part.strip() for part in fmt.split(",")}
    units = "nounits" not in options
    if "noheader" not in options:
        out.append(", ".join(
            f"{field} [{FIELDS[field][1]}]" if FIELDS[field][1] else field for field in fields
        ))
    for card in cards:
        values = []
        for field in fields:
            read, unit = FIELDS[field]
            value = str(count) if field == "count" else read(card)  # all attached cards
            values.append(f"{value} {unit}" if units and unit else value)
        out.append(", ".join(values))
    return 0


def _details(cards: list[Card], out: list[str], filtered: bool) -> None:
    """`nvidia-smi -q` (`-d MEMORY`: the memory section only, as the classic
    `nvidia-smi -q -d Memory | grep -A4 GPU | grep Free` reads it)."""
    first = cards[0]
    out += ["", "==============NVSMI LOG==============", "",
            f"Driver Version                            : {first.driver}",
            f"CUDA Version                              : {first.cuda}", "",
            f"Attached GPUs                             : {len(cards)}"]
    for card in cards:
        out.append(f"GPU {card.bus_id}")
        if not filtered:
            out += [f"    Product Name                          : {card.name}",
                    f"    GPU UUID                              : {card.uuid}"]
        out += ["    FB Memory Usage",
                f"        Total                             : {card.total_mib} MiB",
                "        Used                              : 0 MiB",
                f"        Free                              : {card.total_mib} MiB", ""]


def _table(cards: list[Card], out: list[str]) -> None:
    first = cards[0]
    out += ["+" + "-" * 87 + "+",
            f"| NVIDIA-SMI {first.driver}   Driver Version: {first.driver}   "
            f"CUDA Version: {first.cuda}".ljust(88) + "|",
            "|" + "-" * 87 + "|"]
    for card in cards:
        out.append(f"|   {card.index}  {card.name}".ljust(50)
                   + f"{0}MiB / {card.total_mib}MiB".rjust(30).ljust(38) + "|")
    out += ["+" + "-" * 87 + "+", "| Processes:".ljust(88) + "|",
            "|  No running processes found".ljust(88) + "|", "+" + "-" * 87 + "+"]


def main(args: list[str], name: str, total_mib: int, count: int = 1,
         compute_cap: str = "[N/A]", driver: str = DRIVER_VERSION,
         cuda: str = CUDA_VERSION) -> tuple[int, str]:
    """nvidia-smi's exit code and output for `args` on `count` idle cards (`driver`, `cuda`:
    the driver's version and the CUDA it supports, the stack profile's)."""
    cards = [Card(i, name, total_mib, compute_cap, driver, cuda) for i in range(max(1, count))]
    selected = _option(args, "-i", "--id")
    if selected is not None:
        wanted = {part.strip() for part in selected.split(",")}
        cards = [card for card in cards if str(card.index) in wanted] or cards[:1]
    out: list[str] = []
    code = 0
    query_gpu = _option(args, "--query-gpu")
    query_apps = _option(args, "--query-compute-apps")
    fmt = _option(args, "--format") or "csv"
    if query_gpu is not None:
        fields = [f.strip() for f in query_gpu.split(",") if f.strip()]
        code = _query(cards, fields, fmt, out, max(1, count))
    elif query_apps is not None:
        if "noheader" not in fmt:
            out.append(", ".join(f.strip() for f in query_apps.split(",")))
    elif "-L" in args or "--list-gpus" in args:
        out += [f"GPU {card.index}: {card.name} (UUID: {card.uuid})" for card in cards]
    elif "-q" in args or "--query" in args:
        _details(cards, out, _option(args, "-d", "--display") is not None)
    else:
        _table(cards, out)
    return code, "\n".join(out) + "\n" if out else ""


def install(directory: Path, name: str, total_bytes: int, capability: tuple[int, int],
            driver: str = DRIVER_VERSION, cuda: tuple[int, int] | None = None) -> Path:
    """Write the `nvidia-smi` executable into `directory` and put it first on this process's
    PATH (the job and the processes it starts inherit it). Returns the executable's path.
    `driver` / `cuda`: the stack profile's `driver_version` / `driver_cuda_version`."""
    cuda_text = CUDA_VERSION if cuda is None else "{}.{}".format(*cuda)
    directory.mkdir(parents=True, exist_ok=True)
    executable = directory / COMMAND
    executable.write_text(
        f"#!{sys.executable}\n"
        "import importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('peakmem_fake_nvidia_smi', {__file__!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        f"code, text = module.main(sys.argv[1:], {name!r}, {total_bytes // 2**20}, "
        f"int(os.environ.get('LOCAL_WORLD_SIZE') or 1), {'.'.join(map(str, capability))!r}, "
        f"{driver!r}, {cuda_text!r})\n"
        "(sys.stderr if code else sys.stdout).write(text)\n"
        "sys.exit(code)\n",
        encoding="utf-8",
    )
    executable.chmod(executable.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.environ["PATH"] = os.pathsep.join([str(directory), os.environ.get("PATH", "")])
    return executable
