"""How much of a job's estimate hangs on the cuDNN workspace sizes: the same trace replayed with
every convolution workspace scaled (a diagnostic, never a fit).

    PYTHONPATH=src python benchmarks/workspace_scale_replay.py [--gpu h200] [--torch 2.11.0]
        [--steps 3] [--scales 0,1,2] -- python benchmarks/zoo/vision.py --model resnet50 ...

The job is captured once in this process; each `--scales` factor multiplies the size of every
`cudnn_conv_workspace[...]` allocation (the rule's ALLOC_OR_SMALLER events; docs/cnn.md) and the
trace is replayed through the allocator simulation with no capacity limit. Printed per factor:
the peak reserved and peak allocated bytes (MiB). Factor 1 is the estimate's own replay.

    ... --needed MODULE --measured BYTES -- python benchmarks/zoo/vision.py ...

prints instead, for each cuDNN workspace the module (a tag like `MobileNetV2.features.18.0`)
allocates in the backward, the replay's allocated bytes just before it (its largest over the
steps) and the workspace that would bring the allocated peak to BYTES (a row's measured
`max_allocated_bytes`) if the peak were there: what a convolution's workspace would have to be
for it to explain a miss.
"""

from __future__ import annotations

import argparse
import io
from contextlib import redirect_stderr, redirect_stdout

WORKSPACE_OP = "cudnn_conv_workspace"


def replay_scaled(trace, torch_version: str, scales: list[float]) -> dict[float, tuple[int, int]]:
    """factor -> (peak reserved, peak allocated) bytes of `trace` replayed with every cuDNN
    convolution workspace times the factor; the trace is left as it was."""
    from peakmem.allocator.simulate import simulate

    workspaces = [i for i in range(len(trace))
                  if (tag := trace.tag_of(i)) is not None and (tag.op or "").startswith(WORKSPACE_OP)]
    original = {i: trace.sizes[i] for i in workspaces}
    out: dict[float, tuple[int, int]] = {}
    try:
        for scale in scales:
            for i in workspaces:
                trace.sizes[i] = int(original[i] * scale)
            result = simulate(trace, torch_version=torch_version)
            out[scale] = (result.peak_reserved_bytes, result.peak_allocated_bytes)
    finally:
        for i, size in original.items():
            trace.sizes[i] = size
    return out


def allocated_before(trace, torch_version: str, module: str) -> dict[str, int]:
    """workspace op -> the replay's largest allocated bytes just before `module` allocates that
    cuDNN workspace in the backward."""
    from peakmem.allocator.simulate import simulate

    allocated = simulate(trace, torch_version=torch_version, timeline=True).timeline.allocated
    before: dict[str, int] = {}
    for i in range(1, len(trace)):
        tag = trace.tag_of(i)
        if (tag is not None and tag.module == module and tag.phase == "backward"
                and (tag.op or "").startswith(WORKSPACE_OP)):
            before[tag.op] = max(before.get(tag.op, 0), allocated[i - 1])
    return before


def _capture(argv: list[str], gpu: str, torch_version: str, steps: int):
    from peakmem.estimate import estimate_command

    sink = io.StringIO()
    with redirect_stdout(sink), redirect_stderr(sink):
        return estimate_command(argv, gpu=gpu, torch_version=torch_version, steps=steps,
                                isolate=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--torch", default="2.11.0")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--scales", default="0,1,2")
    parser.add_argument("--needed", metavar="MODULE", default=None)
    parser.add_argument("--measured", type=int, default=None, help="with --needed: bytes")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no job command after --")
    if args.needed is not None:
        if args.measured is None:
            parser.error("--needed takes --measured BYTES")
        trace = _capture(command, args.gpu, args.torch, args.steps).capture.trace
        for op, before in allocated_before(trace, args.torch, args.needed).items():
            print(f"{op}: allocated before it {before / 2**20:.1f} MiB; needed "
                  f"{(args.measured - before) / 2**20:.1f} MiB")
        return
    scales = [float(s) for s in args.scales.split(",")]
    trace = _capture(command, args.gpu, args.torch, args.steps).capture.trace
    for scale, (reserved, allocated) in replay_scaled(trace, args.torch, scales).items():
        print(f"workspaces x {scale:g}: reserved {reserved / 2**20:.1f} MiB, "
              f"allocated {allocated / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
