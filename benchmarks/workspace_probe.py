"""Measure the workspaces cuDNN, cuBLAS/cuBLASLt and SDPA kernels take on this GPU, per op and
shape, with cudnn.benchmark off and on: every op call runs inside its own allocator-history
window, and the allocations made and freed inside a window are that call's temporaries.

    PYTHONPATH=src python benchmarks/workspace_probe.py [--gpu h200] [--quick]

Writes benchmarks/groundtruth/<gpu>_workspaces.pickle (the windows: raw allocator events) and
benchmarks/groundtruth/<gpu>_workspaces.csv (the table, via workspace_table.py). Shapes are the
conv layers of resnet50/vgg16/UNet and the attention/linear shapes of the zoo's transformers.
Each shape runs twice per setting (`call` 1 and 2): with cudnn.benchmark on, call 1 includes the
algorithm search."""

from __future__ import annotations

import argparse
import pickle
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workspace_table import extract, write_table  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

# (N, C_in, H, W, C_out, kernel, stride): resnet50 @224 (batch 32), vgg16, UNet @256
CONV_SHAPES = [
    (32, 3, 224, 224, 64, 7, 2),
    (32, 64, 56, 56, 64, 1, 1),
    (32, 64, 56, 56, 64, 3, 1),
    (32, 64, 56, 56, 256, 1, 1),
    (32, 128, 56, 56, 128, 3, 2),
    (32, 128, 28, 28, 128, 3, 1),
    (32, 256, 14, 14, 256, 3, 1),
    (32, 512, 7, 7, 512, 3, 1),
    (32, 64, 224, 224, 64, 3, 1),
    (32, 256, 56, 56, 256, 3, 1),
    (16, 64, 256, 256, 64, 3, 1),
]
# (B, heads, seq, head_dim, causal)
SDPA_SHAPES = [
    (8, 12, 512, 64, True),
    (16, 12, 1024, 64, True),
    (4, 16, 2048, 64, True),
    (8, 32, 512, 64, False),
    (8, 16, 512, 128, False),
]
# (M, K, N) of a linear layer: tokens x in -> out
LINEAR_SHAPES = [(4096, 768, 3072), (8192, 1024, 4096), (16384, 2048, 8192), (4096, 1280, 50257)]


def windows(torch, device: int) -> Callable[[Callable[[], Any]], list[dict]]:
    """Run ``fn`` inside a fresh allocator-history window; return the window's events."""

    def record(fn: Callable[[], Any]) -> tuple[Any, list[dict]]:
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(
            "all", context=None, stacks="python", clear_history=True
        )
        result = fn()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(None)
        events = [
            {k: e[k] for k in ("action", "addr", "size", "stream") if k in e}
            for e in snapshot["device_traces"][device]
        ]
        return result, events

    return record


def conv_cases(torch, dtypes) -> Iterator[tuple[dict, Callable[[], Any]]]:
    f = torch.nn.functional
    for n, cin, h, w, cout, k, stride in CONV_SHAPES:
        for dtype in dtypes:
            shape = f"{n}x{cin}x{h}x{w}->{cout} k{k} s{stride}"
            x = torch.randn(n, cin, h, w, device="cuda", dtype=dtype, requires_grad=True)
            weight = torch.randn(cout, cin, k, k, device="cuda", dtype=dtype, requires_grad=True)
            meta = {"op": "conv2d", "shape": shape, "dtype": str(dtype).removeprefix("torch."),
                    "library": "cudnn"}  # fmt: skip
            holder: dict = {}

            def forward(x=x, weight=weight, k=k, stride=stride, holder=holder):
                holder["y"] = f.conv2d(x, weight, stride=stride, padding=k // 2)
                return holder["y"]

            yield meta | {"direction": "forward"}, forward

            def backward_data(x=x, holder=holder):
                y = holder["y"]
                return torch.autograd.grad(y, [x], torch.ones_like(y), retain_graph=True)

            yield meta | {"direction": "backward_data"}, backward_data

            def backward_weight(weight=weight, holder=holder):
                y = holder["y"]
                return torch.autograd.grad(y, [weight], torch.ones_like(y), retain_graph=True)

            yield meta | {"direction": "backward_weight"}, backward_weight
            del holder["y"], x, weight


def sdpa_cases(torch, dtypes) -> Iterator[tuple[dict, Callable[[], Any]]]:
    f = torch.nn.functional
    for b, heads, seq, dim, causal in SDPA_SHAPES:
        for dtype in dtypes:
            q, k_, v = (torch.randn(b, heads, seq, dim, device="cuda", dtype=dtype,
                                    requires_grad=True) for _ in range(3))  # fmt: skip
            meta = {"op": "sdpa", "shape": f"{b}x{heads}x{seq}x{dim}{' causal' if causal else ''}",
                    "dtype": str(dtype).removeprefix("torch."), "library": "sdpa"}  # fmt: skip
            holder: dict = {}

            def forward(q=q, k_=k_, v=v, causal=causal, holder=holder):
                holder["o"] = f.scaled_dot_product_attention(q, k_, v, is_causal=causal)
                return holder["o"]

            yield meta | {"direction": "forward"}, forward

            def backward(q=q, k_=k_, v=v, holder=holder):
                o = holder["o"]
                return torch.autograd.grad(o, [q, k_, v], torch.ones_like(o), retain_graph=True)

            yield meta | {"direction": "backward"}, backward
            del holder["o"], q, k_, v


def linear_cases(torch, dtypes) -> Iterator[tuple[dict, Callable[[], Any]]]:
    f = torch.nn.functional
    for m, k, n in LINEAR_SHAPES:
        for dtype in dtypes:
            x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
            w = torch.randn(n, k, device="cuda", dtype=dtype, requires_grad=True)
            bias = torch.randn(n, device="cuda", dtype=dtype, requires_grad=True)
            meta = {"op": "linear", "shape": f"{m}x{k}->{n}",
                    "dtype": str(dtype).removeprefix("torch."), "library": "cublas"}  # fmt: skip
            holder: dict = {}

            def forward(x=x, w=w, bias=bias, holder=holder):
                holder["y"] = f.linear(x, w, bias)
                return holder["y"]

            yield meta | {"direction": "forward"}, forward

            def backward(x=x, w=w, bias=bias, holder=holder):
                y = holder["y"]
                return torch.autograd.grad(y, [x, w, bias], torch.ones_like(y), retain_graph=True)

            yield meta | {"direction": "backward"}, backward
            del holder["y"], x, w, bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", help="profile name (default: from the GPU's name)")
    parser.add_argument("--out-dir", type=Path, default=REPO / "benchmarks" / "groundtruth")
    parser.add_argument("--quick", action="store_true", help="first shape of each kind only")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("workspace_probe: no CUDA GPU")
    from peakmem.measure.groundtruth import profile_name

    gpu = args.gpu or profile_name(torch.cuda.get_device_name(0))
    if args.quick:
        CONV_SHAPES[1:] = []
        SDPA_SHAPES[1:] = []
        LINEAR_SHAPES[1:] = []
    record = windows(torch, torch.cuda.current_device())
    dtypes = (torch.float32, torch.bfloat16)
    found: list[dict] = []
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        for cases in (conv_cases, sdpa_cases, linear_cases):
            if cases is not conv_cases and benchmark:
                continue  # cudnn.benchmark only changes convolutions
            for meta, fn in cases(torch, dtypes):
                for call in (1, 2):
                    _, events = record(fn)
                    found.append(meta | {"benchmark": benchmark, "call": call, "events": events})
    data = {
        "meta": {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda,
                 "cudnn": torch.backends.cudnn.version(),
                 "device": torch.cuda.get_device_name(0)},
        "windows": found,
    }  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    pickle_path = args.out_dir / f"{gpu}_workspaces.pickle"
    with pickle_path.open("wb") as handle:
        pickle.dump(data, handle)
    table = args.out_dir / f"{gpu}_workspaces.csv"
    write_table(extract(data, pickle_path.name), table)
    print(f"wrote {len(found)} windows to {pickle_path} and the table to {table}")


if __name__ == "__main__":
    main()
