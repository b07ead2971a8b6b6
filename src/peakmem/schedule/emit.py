# STUB for the issue-19 branch: replaced by issue 18's module at merge
"""Scheduler request formats for an estimate (stub: only the `hami` format)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MIB = 2**20


@dataclass(frozen=True)
class ContainerRequest:
    limits: dict[str, str] = field(default_factory=dict)
    requests: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)


def _hami(estimate: dict[str, Any], **options: Any) -> ContainerRequest:
    mib = math.ceil(int(estimate["peak_bytes_with_margin"]) / MIB)
    return ContainerRequest(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)})


FORMATS = {"hami": _hami}


def container_request(estimate: dict[str, Any], fmt: str, **options: Any) -> ContainerRequest:
    try:
        emit = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown scheduler format {fmt!r}; choose one of {', '.join(FORMATS)}") from None
    return emit(estimate, **options)
