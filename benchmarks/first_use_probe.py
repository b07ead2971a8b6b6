"""Measure the device memory each kernel family loads outside PyTorch's allocator on first use
(issue 6, item 1): CUDA context, cuDNN/cuBLAS handles, lazily loaded kernel images, NVRTC-compiled
cuDNN engines.

    PYTHONPATH=src python benchmarks/first_use_probe.py OUTDIR [--budget-s 240]
        [--modes LAZY,EAGER] [--isolate default|next|all|none|fam1,fam2] [--dry-run]

Writes OUTDIR/first_use.csv (schema: peakmem.measure.cudnn_tables.FIRST_USE_SCHEMA, see
docs/MEASURE.md) and OUTDIR/first_use.json (versions, the environment, the processes run).

Every family is a list of stages (`setup` makes its inputs, then `forward`, `backward` or
`step`); each stage runs twice (`call` 1 and 2), and around every call the probe synchronizes
and reads `torch.cuda.mem_get_info` (device used = total - free), `memory_reserved` and
`memory_allocated`: `outside = used - reserved` (minus what the device used before this process
made its context, read through NVML when nvidia-ml-py is installed; the GPU must be otherwise
idle). `outside_delta_bytes` of call 1 is what the first use loaded; call 2 should add nothing.

Runs, each in a fresh process, one after the other:
- `sequence`: every family in the fixed order of FAMILIES, in one process, once per module
  loading mode (--modes; CUDA_MODULE_LOADING is set for the child: LAZY is what torch sets when
  the variable is unset, EAGER loads every kernel at context creation): cumulative numbers, a
  family's delta leaves out what an earlier family loaded already;
- `isolated`: one process per family (--isolate; LAZY), running the context, the `common`
  family (tensor factories, copies, elementwise basics), then that family alone: the family's own
  first-use cost. Each process costs an interpreter start and a CUDA init (~3-6 s), so the
  default list is a subset; --budget-s stops starting processes when time is short.

`--dry-run` (no GPU) lists the families and stages and writes a header-only table;
`--device cpu` runs every stage for real on the CPU with zero memory readings (tests only).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from peakmem.measure.cudnn_tables import (  # noqa: E402
    FIRST_USE_COLUMNS,
    FIRST_USE_SCHEMA,
    blank_row,
    check_row,
)

TABLE = "first_use.csv"
Stage = Callable[[], Any]
# name -> builder(torch, device, small) -> list of (stage name, fn); the builder itself is the
# `setup` stage (it makes the inputs)
Builder = Callable[[Any, str, bool], list[tuple[str, Stage]]]
FAMILIES: dict[str, Builder] = {}

NEXT_LEASE_ISOLATE = [
    "addmm_bf16", "mm_bf16", "mm_tf32", "bmm_bf16", "mlp_autocast_bf16", "mlp_autocast_fp32",
    "transformer_block_autocast_bf16", "transformer_block_autocast_fp32", "sdpa_flash_bf16",
    "sdpa_efficient_fp32", "dropout_bf16", "layer_norm_bf16", "conv_stem_nograd_tf32",
    "conv_stem_nograd_bf16", "conv_tf32", "conv_bf16",
]  # fmt: skip
"""`--isolate next` (docs/context.md "The 28 misses"): which of a bf16 Transformer's ops loads the
16 MiB that bf16 MLPs / DLRMs do not (bf16 GEMMs alone, a whole block, flash attention, dropout,
bf16 layer norm), and what a patch stem whose input needs no gradient loads beside a
full convolution."""

DEFAULT_ISOLATE = [
    "conv_tf32", "conv_bf16", "batch_norm_fp32", "relu_fp32", "gelu_fp32", "mish_fp32",
    "prelu_fp32", "dropout_fp32", "max_pool2d_fp32", "adaptive_avg_pool2d_fp32", "mm_tf32",
    "addmm_bf16", "sdpa_default_bf16", "sdpa_flash_bf16", "sdpa_efficient_bf16",
    "embedding_fp32", "cross_entropy_fp32", "layer_norm_fp32", "adam_foreach", "adamw_fused",
    "sgd_foreach",
]  # fmt: skip


def family(name: str) -> Callable[[Builder], Builder]:
    def register(fn: Builder) -> Builder:
        if name in FAMILIES:
            raise ValueError(f"family {name!r} registered twice")
        FAMILIES[name] = fn
        return fn

    return register


def _dtype(torch: Any, name: str) -> Any:
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[name]  # fmt: skip


def fwd_bwd(torch: Any, forward: Callable[[], Any], inputs: list[Any]) -> list[tuple[str, Stage]]:
    """`forward` then `backward` (autograd.grad of the output w.r.t. ``inputs`` with a dense
    upstream gradient made in the forward stage; the graph is kept for the second call)."""
    state: dict[str, Any] = {}

    def fwd() -> None:
        out = forward()
        state["y"] = out
        state["dy"] = torch.randn_like(out) if out.is_floating_point() else None

    def bwd() -> None:
        torch.autograd.grad(state["y"], inputs, state["dy"], retain_graph=True)

    return [("forward", fwd), ("backward", bwd)]


# ------------------------------------------------------------------------------- families


@family("common")
def _common(torch, dev, small):
    def basics() -> None:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            a = torch.randn(1000, device=dev, dtype=dtype)
            b = torch.rand(1000, device=dev, dtype=dtype)
            (a + b).mul_(2).sum()
            torch.zeros(10, device=dev, dtype=dtype).fill_(1)
            torch.ones(10, device=dev, dtype=dtype)
            torch.randn_like(a).copy_(b)
            a.float().to(dtype)
        torch.randint(0, 10, (100,), device=dev)
        torch.zeros(10, device=dev, dtype=torch.int64)

    return [("forward", basics)]


def _conv(dtype_mode: str, layout: str = "nchw", groups: int = 1) -> Builder:
    def build(torch, dev, small):
        torch.backends.cudnn.allow_tf32 = dtype_mode != "fp32"
        n, c, hw = (2, 8, 8) if small else (16, 64, 56)
        dtype = _dtype(torch, dtype_mode)
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        x = torch.randn(n, c, hw, hw, device=dev, dtype=dtype).to(memory_format=fmt)
        w = torch.randn(c, c // groups, 3, 3, device=dev, dtype=dtype).to(memory_format=fmt)
        b = torch.randn(c, device=dev, dtype=dtype)
        inputs = [x.requires_grad_(), w.requires_grad_(), b.requires_grad_()]
        conv = torch.nn.functional.conv2d
        return fwd_bwd(torch, lambda: conv(x, w, b, padding=1, groups=groups), inputs)

    return build


for _mode in ("tf32", "fp32", "bf16", "fp16"):
    family(f"conv_{_mode}")(_conv(_mode))
family("conv_tf32_channels_last")(_conv("tf32", "channels_last"))
family("conv_bf16_channels_last")(_conv("bf16", "channels_last"))
family("conv_depthwise_fp32")(_conv("tf32", groups=8))


def _batch_norm(dtype_mode: str, layout: str = "nchw") -> Builder:
    def build(torch, dev, small):
        n, c, hw = (2, 8, 8) if small else (16, 64, 56)
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        x = torch.randn(n, c, hw, hw, device=dev, dtype=_dtype(torch, dtype_mode))
        x = x.to(memory_format=fmt).requires_grad_()
        bn = torch.nn.BatchNorm2d(c, device=dev)  # fp32 parameters, as under autocast
        return fwd_bwd(torch, lambda: bn(x), [x, *bn.parameters()])

    return build


family("batch_norm_fp32")(_batch_norm("fp32"))
family("batch_norm_bf16")(_batch_norm("bf16"))
family("batch_norm_fp32_channels_last")(_batch_norm("fp32", "channels_last"))

ACTIVATIONS = {
    "relu": "ReLU", "gelu": "GELU", "silu": "SiLU", "mish": "Mish", "tanh": "Tanh",
    "sigmoid": "Sigmoid", "elu": "ELU", "selu": "SELU", "softplus": "Softplus",
    "leaky_relu": "LeakyReLU", "prelu": "PReLU", "hardswish": "Hardswish",
}  # fmt: skip


def _module_family(make: Callable[[Any, str, Any], Any], dtype_mode: str) -> Builder:
    def build(torch, dev, small):
        dtype = _dtype(torch, dtype_mode)
        x = torch.randn(*((2, 8, 8, 8) if small else (16, 64, 56, 56)), device=dev, dtype=dtype)
        x.requires_grad_()
        module = make(torch, dev, dtype)
        return fwd_bwd(torch, lambda: module(x), [x, *module.parameters()])

    return build


for _dt in ("fp32", "bf16"):
    for _act, _cls in ACTIVATIONS.items():
        family(f"{_act}_{_dt}")(
            _module_family(
                lambda torch, dev, dtype, c=_cls: getattr(torch.nn, c)().to(dev, dtype), _dt
            )  # fmt: skip
        )
    family(f"dropout_{_dt}")(_module_family(lambda torch, dev, dtype: torch.nn.Dropout(0.3), _dt))
    for _pool, _make in {
        "max_pool2d": lambda torch, dev, dtype: torch.nn.MaxPool2d(2),
        "avg_pool2d": lambda torch, dev, dtype: torch.nn.AvgPool2d(2),
        "adaptive_avg_pool2d": lambda torch, dev, dtype: torch.nn.AdaptiveAvgPool2d(1),
        "adaptive_max_pool2d": lambda torch, dev, dtype: torch.nn.AdaptiveMaxPool2d(1),
        "softmax": lambda torch, dev, dtype: torch.nn.Softmax(dim=1),
        "log_softmax": lambda torch, dev, dtype: torch.nn.LogSoftmax(dim=1),
    }.items():
        family(f"{_pool}_{_dt}")(_module_family(_make, _dt))


def _matmul(kind: str, dtype_mode: str) -> Builder:
    def build(torch, dev, small):
        torch.backends.cuda.matmul.allow_tf32 = dtype_mode == "tf32"
        dtype = _dtype(torch, dtype_mode)
        m = 64 if small else 4096
        a = torch.randn(m, m, device=dev, dtype=dtype, requires_grad=True)
        b = torch.randn(m, m, device=dev, dtype=dtype, requires_grad=True)
        bias = torch.randn(m, device=dev, dtype=dtype, requires_grad=True)
        if kind == "mm":
            return fwd_bwd(torch, lambda: a @ b, [a, b])
        if kind == "addmm":
            return fwd_bwd(torch, lambda: torch.nn.functional.linear(a, b, bias), [a, b, bias])
        a3 = torch.randn(8, m // 8, m // 8, device=dev, dtype=dtype, requires_grad=True)
        b3 = torch.randn(8, m // 8, m // 8, device=dev, dtype=dtype, requires_grad=True)
        return fwd_bwd(torch, lambda: torch.bmm(a3, b3), [a3, b3])

    return build


for _kind in ("mm", "addmm", "bmm"):
    for _mode in ("fp32", "tf32", "bf16"):
        family(f"{_kind}_{_mode}")(_matmul(_kind, _mode))


def _sdpa(backend: str, dtype_mode: str) -> Builder:
    def build(torch, dev, small):
        dtype = _dtype(torch, dtype_mode)
        shape = (2, 2, 16, 16) if small else (8, 12, 1024, 64)
        q, k, v = (torch.randn(*shape, device=dev, dtype=dtype, requires_grad=True)
                   for _ in range(3))  # fmt: skip
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def forward():
            if backend == "default":
                return sdpa(q, k, v, is_causal=True)
            from torch.nn.attention import SDPBackend, sdpa_kernel

            chosen = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                      "math": "MATH", "cudnn": "CUDNN_ATTENTION"}[backend]  # fmt: skip
            with sdpa_kernel(getattr(SDPBackend, chosen)):
                return sdpa(q, k, v, is_causal=True)

        return fwd_bwd(torch, forward, [q, k, v])

    return build


for _backend, _mode in (("default", "bf16"), ("flash", "bf16"), ("efficient", "bf16"),
                        ("efficient", "fp32"), ("math", "bf16"), ("cudnn", "bf16")):  # fmt: skip
    family(f"sdpa_{_backend}_{_mode}")(_sdpa(_backend, _mode))


def _conv_stem_nograd(dtype_mode: str) -> Builder:
    """A ViT / Swin patch-embedding stem: a stride-16 16x16 convolution of the image, whose input
    needs no gradient, so autograd's convolution backward computes grad_weight (and grad_bias)
    only, no backward-data (the `conv_*` families' input requires grad)."""

    def build(torch, dev, small):
        torch.backends.cudnn.allow_tf32 = dtype_mode != "fp32"
        dtype = _dtype(torch, dtype_mode)
        n, hw, dim = (2, 32, 8) if small else (16, 224, 768)
        x = torch.randn(n, 3, hw, hw, device=dev, dtype=dtype)  # no requires_grad: the image
        w = torch.randn(dim, 3, 16, 16, device=dev, dtype=dtype, requires_grad=True)
        b = torch.randn(dim, device=dev, dtype=dtype, requires_grad=True)
        conv = torch.nn.functional.conv2d
        return fwd_bwd(torch, lambda: conv(x, w, b, stride=16), [w, b])

    return build


for _mode in ("tf32", "bf16"):
    family(f"conv_stem_nograd_{_mode}")(_conv_stem_nograd(_mode))


def _autocast(torch: Any, dev: str, dtype_mode: str) -> Any:
    """The zoo's `--precision bf16`: fp32 parameters, the forward under autocast."""
    if dtype_mode == "fp32":
        import contextlib

        return contextlib.nullcontext()
    return torch.autocast(device_type=dev, dtype=_dtype(torch, dtype_mode))


def _transformer_block(dtype_mode: str) -> Builder:
    """One pre-norm Transformer encoder block (BERT-base sizes: 768 wide, 12 heads, GELU FFN of
    3072, dropout 0.1, training mode: attention through SDPA), as the zoo runs it (fp32 weights,
    autocast for bf16): what a bf16 Transformer runs that a bf16 MLP (`mlp_autocast_*`) does not."""

    def build(torch, dev, small):
        torch.backends.cuda.matmul.allow_tf32 = False
        d, heads, ff, shape = (16, 2, 32, (2, 8, 16)) if small else (768, 12, 3072, (8, 512, 768))
        block = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.1, activation="gelu",
                                                 batch_first=True, norm_first=True,
                                                 device=dev)  # fmt: skip
        block.train()
        x = torch.randn(*shape, device=dev, requires_grad=True)

        def forward():
            with _autocast(torch, dev, dtype_mode):
                return block(x).float()

        return fwd_bwd(torch, forward, [x, *block.parameters()])

    return build


def _mlp(dtype_mode: str) -> Builder:
    """Linear -> GELU -> Linear (4096 wide) under the zoo's precision: GEMMs without attention."""

    def build(torch, dev, small):
        torch.backends.cuda.matmul.allow_tf32 = False
        d, n = (16, 8) if small else (4096, 2048)
        mlp = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.GELU(),
                                  torch.nn.Linear(d, d)).to(dev)  # fmt: skip
        x = torch.randn(n, d, device=dev, requires_grad=True)

        def forward():
            with _autocast(torch, dev, dtype_mode):
                return mlp(x).float()

        return fwd_bwd(torch, forward, [x, *mlp.parameters()])

    return build


for _mode in ("fp32", "bf16"):
    family(f"transformer_block_autocast_{_mode}")(_transformer_block(_mode))
    family(f"mlp_autocast_{_mode}")(_mlp(_mode))


@family("embedding_fp32")
def _embedding(torch, dev, small):
    emb = torch.nn.Embedding(100 if small else 50000, 16 if small else 768, device=dev)
    idx = torch.randint(0, emb.num_embeddings, (4, 8) if small else (16, 512), device=dev)
    return fwd_bwd(torch, lambda: emb(idx), [emb.weight])


@family("embedding_bag_fp32")
def _embedding_bag(torch, dev, small):
    emb = torch.nn.EmbeddingBag(100 if small else 100000, 16 if small else 128, mode="sum",
                                device=dev)  # fmt: skip
    idx = torch.randint(0, emb.num_embeddings, (4, 8) if small else (2048, 20), device=dev)
    return fwd_bwd(torch, lambda: emb(idx), [emb.weight])


def _cross_entropy(dtype_mode: str) -> Builder:
    def build(torch, dev, small):
        n, classes = (8, 10) if small else (4096, 1000)
        logits = torch.randn(n, classes, device=dev, dtype=_dtype(torch, dtype_mode))
        logits.requires_grad_()
        target = torch.randint(0, classes, (n,), device=dev)
        return fwd_bwd(torch, lambda: torch.nn.functional.cross_entropy(logits, target), [logits])

    return build


family("cross_entropy_fp32")(_cross_entropy("fp32"))
family("cross_entropy_bf16")(_cross_entropy("bf16"))


def _layer_norm(dtype_mode: str) -> Builder:
    def build(torch, dev, small):
        dtype = _dtype(torch, dtype_mode)
        x = torch.randn(*((4, 8, 16) if small else (16, 512, 768)), device=dev, dtype=dtype)
        x.requires_grad_()
        ln = torch.nn.LayerNorm(x.shape[-1], device=dev, dtype=dtype)
        return fwd_bwd(torch, lambda: ln(x), [x, *ln.parameters()])

    return build


family("layer_norm_fp32")(_layer_norm("fp32"))
family("layer_norm_bf16")(_layer_norm("bf16"))


@family("cat_fp32")
def _cat(torch, dev, small):
    shape = (2, 8, 8, 8) if small else (16, 64, 56, 56)
    a = torch.randn(*shape, device=dev, requires_grad=True)
    b = torch.randn(*shape, device=dev, requires_grad=True)
    return fwd_bwd(torch, lambda: torch.cat([a, b], dim=1), [a, b])


def _optimizer(name: str, **kwargs: Any) -> Builder:
    def build(torch, dev, small):
        sizes = [(64, 64), (64,), (10, 64)] if small else [(4096, 4096), (4096,), (1000, 4096),
                                                             (64, 64, 3, 3), (64,)]  # fmt: skip
        params = [torch.nn.Parameter(torch.randn(*s, device=dev)) for s in sizes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = getattr(torch.optim, name)(params, lr=1e-3, **kwargs)
        return [("step", opt.step)]

    return build


family("sgd_foreach")(_optimizer("SGD", foreach=True))
family("sgd_momentum_foreach")(_optimizer("SGD", momentum=0.9, foreach=True))
family("sgd_fused")(_optimizer("SGD", momentum=0.9, fused=True))
family("adam_foreach")(_optimizer("Adam", foreach=True))
family("adam_fused")(_optimizer("Adam", fused=True))
family("adamw_foreach")(_optimizer("AdamW", foreach=True))
family("adamw_fused")(_optimizer("AdamW", fused=True))


@family("grad_scaler_fp16")
def _grad_scaler(torch, dev, small):
    model = torch.nn.Linear(16 if small else 1024, 16 if small else 1024, device=dev)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    scaler = torch.amp.GradScaler(dev)
    x = torch.randn(8 if small else 256, model.in_features, device=dev)

    def step() -> None:
        with torch.autocast(dev, dtype=torch.float16 if dev == "cuda" else torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    return [("step", step)]


# ------------------------------------------------------------------------------ measurement


class Reader:
    """Device readings. On the CPU every reading is 0 (tests)."""

    def __init__(self, torch: Any, device: str) -> None:
        self.torch = torch
        self.device = device
        self.pre_init_used = -1  # device used before this process's context (NVML), -1 unknown
        self._nvml: Any = None
        self._handle: Any = None
        if device == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
                index = int(visible) if visible.isdigit() else 0
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                self._nvml = pynvml
                self.pre_init_used = int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            except Exception:  # noqa: BLE001 - no nvidia-ml-py or no driver access
                self._nvml = None

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def used(self) -> int:
        if self.device != "cuda":
            return 0
        free, total = self.torch.cuda.mem_get_info()
        return int(total - free)

    def reserved(self) -> int:
        return int(self.torch.cuda.memory_reserved()) if self.device == "cuda" else 0

    def allocated(self) -> int:
        return int(self.torch.cuda.memory_allocated()) if self.device == "cuda" else 0

    def peak_allocated(self) -> int:
        return int(self.torch.cuda.max_memory_allocated()) if self.device == "cuda" else 0

    def reset_peak(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.reset_peak_memory_stats()

    def nvml_process(self) -> int:
        if self._nvml is None:
            return -1
        try:
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
        except Exception:  # noqa: BLE001
            pass
        return -1

    def other(self) -> int:
        """Device memory used by others before this process (0 when unknown)."""
        return max(self.pre_init_used, 0)


def classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if "OutOfMemoryError" in text or "out of memory" in text:
        return "oom"
    if any(s in text for s in ("No available kernel", "not supported", "NOT_SUPPORTED",
                               "not implemented", "No viable backend", "unsupported")):  # fmt: skip
        return "unsupported"
    return "error"


def measure(reader: Reader, fn: Stage) -> dict[str, Any]:
    """One call of ``fn`` with readings before and after."""
    reader.sync()
    used0, reserved0 = reader.used(), reader.reserved()
    allocated0 = reader.allocated()
    reader.reset_peak()
    status, error = "ok", ""
    started = time.perf_counter()
    try:
        fn()
        reader.sync()
    except Exception as exc:  # noqa: BLE001 - every failure is a row
        status, error = classify(exc), f"{type(exc).__name__}: {exc}"[:300]
        reader.sync()
    seconds = time.perf_counter() - started
    used1, reserved1 = reader.used(), reader.reserved()
    other = reader.other()
    before, after = used0 - reserved0 - other, used1 - reserved1 - other
    return {
        "status": status, "error": error,
        "outside_before_bytes": before, "outside_after_bytes": after,
        "outside_delta_bytes": after - before,
        "device_used_before_bytes": used0, "device_used_after_bytes": used1,
        "reserved_before_bytes": reserved0, "reserved_after_bytes": reserved1,
        "allocated_after_bytes": reader.allocated(),
        "peak_allocated_delta_bytes": max(reader.peak_allocated() - allocated0, 0),
        "nvml_process_after_bytes": reader.nvml_process(), "seconds": round(seconds, 6),
    }  # fmt: skip


def versions(torch: Any, device: str, reader: Reader) -> dict[str, str]:
    if device != "cuda":
        return {"gpu": "cpu", "driver": "", "torch": torch.__version__, "cuda": "", "cudnn": ""}
    driver = ""
    if reader._nvml is not None:
        raw = reader._nvml.nvmlSystemGetDriverVersion()
        driver = raw.decode() if isinstance(raw, bytes) else str(raw)
    return {"gpu": torch.cuda.get_device_name(0), "driver": driver, "torch": torch.__version__,
            "cuda": str(torch.version.cuda), "cudnn": str(torch.backends.cudnn.version())}  # fmt: skip


def run_process(torch: Any, device: str, families: list[str], run: str, process: int,
                small: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    """The context, then each family's stages twice, in order. Rows in the table's schema."""
    reader = Reader(torch, device)
    rows: list[dict[str, Any]] = []
    common: dict[str, Any] = {"run": run, "process": process}

    def add(fam: str, stage: str, call: int, reading: dict[str, Any]) -> None:
        row = blank_row(FIRST_USE_SCHEMA)
        row.update(common, order=len(rows), family=fam, stage=stage, call=call, **reading)
        rows.append(row)

    # the context: before it there is nothing of ours on the device
    started = time.perf_counter()
    if device == "cuda":
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # a tiny tensor: the first allocation and kernel
    reading = measure(reader, lambda: None)
    context = dict(reading, outside_before_bytes=0, outside_delta_bytes=reading["outside_after_bytes"],
                   device_used_before_bytes=reader.pre_init_used, reserved_before_bytes=0,
                   seconds=round(time.perf_counter() - started, 6))  # fmt: skip
    common.update(versions(torch, device, reader))
    common["module_loading"] = os.environ.get("CUDA_MODULE_LOADING", "(unset)")
    add("context", "init", 1, context)
    poisoned = False
    for fam in families:
        build = FAMILIES[fam]
        stages: list[tuple[str, Stage]] = []

        def setup(build=build, stages=stages) -> None:
            stages.extend(build(torch, device, small))

        reading = measure(reader, setup)
        add(fam, "setup", 1, reading)
        if reading["status"] != "ok":
            continue
        for stage, fn in stages:
            for call in (1, 2):
                reading = measure(reader, fn)
                add(fam, stage, call, reading)
                poisoned = poisoned or any(s in reading["error"] for s in (
                    "illegal memory access", "device-side assert", "unspecified launch failure"))  # fmt: skip
                if reading["status"] != "ok":
                    break
            if reading["status"] != "ok":
                break  # the later stages need this one
        stages.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
        if poisoned:
            break
    for row in rows:
        check_row(row, FIRST_USE_SCHEMA)
    return rows


def append_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    new = not path.exists() or not path.stat().st_size
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIRST_USE_COLUMNS)
        if new:
            writer.writeheader()
        writer.writerows(rows)


def plan(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """(run, CUDA_MODULE_LOADING, families) per process, in order."""
    order = [f for f in FAMILIES if f != "common"]
    processes = [("sequence", mode, ["common", *order]) for mode in args.modes.split(",") if mode]
    if args.isolate == "all":
        isolate = order
    elif args.isolate == "default":
        isolate = DEFAULT_ISOLATE
    elif args.isolate == "next":
        isolate = NEXT_LEASE_ISOLATE
    elif args.isolate == "none":
        isolate = []
    else:
        isolate = [f for f in args.isolate.split(",") if f]
    unknown = [f for f in isolate if f not in FAMILIES]
    if unknown:
        raise SystemExit(f"first_use_probe: unknown families {unknown}; known: {list(FAMILIES)}")
    processes += [("isolated", "LAZY", ["common", fam]) for fam in isolate]
    return processes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--modes", default="LAZY,EAGER", help="CUDA_MODULE_LOADING per sequence")
    parser.add_argument("--isolate", default="default", help="default, next, all, none or a list")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--small", action="store_true", help="tiny inputs (CPU tests)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.outdir / TABLE
    if args.child:  # "run,process,fam1,fam2,..."
        import torch

        run, process, *families = args.child.split(",")
        rows = run_process(torch, args.device, families, run, int(process), args.small)
        append_rows(out, rows)
        return 0
    processes = plan(args)
    args.outdir.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        append_rows(out, [])
        for run, mode, fams in processes:
            print(f"{run:9s} {mode:6s} {len(fams)} families: {' '.join(fams)}")
        print(f"dry run: {len(processes)} processes; wrote the header of {out}")
        return 0
    if args.device == "cpu":  # tests: in this process, every family once
        import torch

        families = processes[0][2] if processes else ["common"]
        append_rows(out, run_process(torch, "cpu", families, "sequence", 0, args.small))
        return 0
    start = time.time()
    meta: dict[str, Any] = {
        "env_before": {k: os.environ.get(k, "(unset)") for k in (
            "CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG",
            "CUDA_VISIBLE_DEVICES")},
        "processes": [],
    }  # fmt: skip
    for index, (run, mode, fams) in enumerate(processes):
        left = args.budget_s - (time.time() - start)
        if left < 15:
            print(f"first_use_probe: budget spent, {len(processes) - index} processes not run")
            break
        env = dict(os.environ, CUDA_MODULE_LOADING=mode)
        cmd = [sys.executable, __file__, str(args.outdir), "--child",
               ",".join([run, str(index), *fams])]  # fmt: skip
        began = time.time()
        try:
            rc = subprocess.run(cmd, env=env, timeout=left, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = -9
        meta["processes"].append({"run": run, "module_loading": mode, "families": fams, "rc": rc,
                                  "seconds": round(time.time() - began, 1)})  # fmt: skip
        print(f"first_use_probe: {run} {mode} {fams[-1] if run == 'isolated' else ''} rc={rc} "
              f"{time.time() - began:.1f} s", flush=True)  # fmt: skip
    (args.outdir / "first_use.json").write_text(json.dumps(meta, indent=1) + "\n")
    summarize(out)
    return 0


def summarize(path: Path) -> None:
    if not path.exists():
        return
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if row["call"] == "1" and row["run"] == "sequence" and int(row["outside_delta_bytes"]):
            print(f"  {row['module_loading']:6s} {row['family']:28s} {row['stage']:8s} "
                  f"{int(row['outside_delta_bytes']) / 2**20:8.1f} MiB {row['status']}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
