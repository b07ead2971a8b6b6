"""The first-use model of the memory outside the allocator (estimate/first_use.py): its figures
come from the measured H200 table, the op -> family registry, and what it adds to estimates."""

from pathlib import Path

import pytest
import torch

from peakmem.estimate import estimate
from peakmem.estimate.first_use import (
    BASE,
    FIRST_USE_FAMILIES,
    families_run,
    first_use_bytes,
    register,
)
from peakmem.measure.cudnn_tables import read_first_use
from peakmem.profiles import load_gpu, load_stack

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "benchmarks" / "groundtruth" / "h200_first_use.csv"
MiB = 1 << 20


@pytest.fixture(scope="module")
def lazy() -> dict[int, int]:
    """Sequence LAZY: order -> what the row added outside the allocator (NVML's per-process
    figure - memory_reserved, against the row before)."""
    table = read_first_use(TABLE)
    rows = table[table["module_loading"] == "LAZY"].sort_values("order")
    outside = (rows["nvml_process_after_bytes"] - rows["reserved_after_bytes"]).astype("int64")
    added = outside.diff().fillna(outside).astype("int64")
    return dict(zip(rows["order"].astype(int), added, strict=True))


@pytest.fixture(scope="module")
def h200():
    return load_stack("2.11.0"), load_gpu("h200")


def test_the_h200_figures_are_the_table_rows_they_cite(lazy, h200):
    stack, gpu = h200
    table = stack.first_use_table(gpu, environ={})
    assert table[BASE].value == lazy[0] == 610 * MiB
    assert table["cublas_gemm"].value == lazy[245] + lazy[247] == 128 * MiB
    assert table["batched_gemm"].value == lazy[280]
    assert table["sdpa_efficient"].value == lazy[305]
    assert table["avg_pool"].value == lazy[127]
    assert stack.library_bytes_for(gpu, "cudnn_convolution").value == lazy[5] + lazy[7] == 20 * MiB
    # families the table measured at nothing are stated as such
    for name, orders in {"sdpa_flash": range(294, 299), "fused_optimizer": (360, 366, 372),
                         "grad_scaler": range(375, 378)}.items():  # fmt: skip
        assert table[name].value == 0 == sum(lazy[order] for order in orders)
    for name in ("base", "cublas_gemm", "batched_gemm", "sdpa_efficient", "avg_pool",
                 "sdpa_flash", "fused_optimizer", "grad_scaler"):  # fmt: skip
        assert "h200_first_use.csv" in table[name].source
    # what the cited rows leave out added nothing: the families are the only rows that grew
    cited = {0, 5, 7, 127, 245, 247, 280, 305}
    assert {order for order, added in lazy.items() if added} == cited


def test_the_table_is_not_additive_across_dtypes(lazy):
    # bf16 / tf32 GEMMs after the fp32 ones and every SDPA backend after them load nothing
    # more: a job's figure follows the families it runs, not one entry per dtype
    assert all(lazy[order] == 0 for order in range(249, 259))  # mm_tf32, mm_bf16
    assert all(lazy[order] == 0 for order in range(289, 304))  # sdpa default/flash/efficient bf16


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        (set(), {"torch_kernels"}),
        ({"addmm", "mm"}, {"torch_kernels", "cublas_gemm"}),
        ({"bmm"}, {"torch_kernels", "cublas_gemm", "batched_gemm"}),
        ({"_scaled_dot_product_efficient_attention"}, {"torch_kernels", "sdpa_efficient"}),
        ({"_scaled_dot_product_flash_attention"}, {"torch_kernels", "sdpa_flash"}),
        ({"avg_pool2d", "max_pool2d"}, {"torch_kernels", "avg_pool"}),
        ({"convolution", "relu"}, {"torch_kernels"}),  # cuDNN: the capture's library charge
        ({"_fused_adamw_", "_foreach_add_"}, {"torch_kernels", "fused_optimizer"}),
        ({"_amp_update_scale_"}, {"torch_kernels", "grad_scaler"}),
        ({"addmm", "addmm:bf16", "embedding"}, {"torch_kernels", "cublas_gemm", "bf16_gemm"}),
        # bf16 GEMMs without an embedding (the bf16 MLPs / DLRMs: nothing above fp32)
        ({"addmm", "addmm:bf16", "_to_copy:bf16", "relu:bf16"}, {"torch_kernels", "cublas_gemm"}),
        ({"addmm", "addmm:f16", "embedding"}, {"torch_kernels", "cublas_gemm"}),
        ({"addmm", "addmm:bf16", "embedding", "convolution"}, {"torch_kernels", "cublas_gemm"}),
    ],
)
def test_ops_map_to_families(ops, expected):
    assert set(families_run(ops)) == expected


def test_a_family_registers_once():
    with pytest.raises(ValueError, match="registered twice"):
        register("cublas_gemm", ("mm",), "again")
    with pytest.raises(ValueError, match="registered twice"):
        register(BASE, None, "the base is not a family")
    assert "cublas_gemm" in FIRST_USE_FAMILIES


def test_only_gpus_with_a_table_and_lazy_loading_get_the_model(h200, monkeypatch):
    stack, gpu = h200
    assert first_use_bytes(stack, gpu, {"mm"})["cublas_gemm"] == 128 * MiB
    assert first_use_bytes(stack, load_gpu("a100-40gb"), {"mm"}) == {}
    monkeypatch.setenv("CUDA_MODULE_LOADING", "EAGER")
    assert first_use_bytes(stack, gpu, {"mm"}) == {}
    assert stack.context_for(gpu).value != 610 * MiB


def attention_job(precision: str) -> None:
    model = torch.nn.ModuleDict({
        "wte": torch.nn.Embedding(100, 64),
        "qkv": torch.nn.Linear(64, 192),
        "out": torch.nn.Linear(64, 64),
    })
    model = model.cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(2, 128, 64, device="cuda")
    tokens = torch.randint(0, 100, (2, 128), device="cuda")
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            # GPT-2's token embedding (wte), then the attention block
            h = model["qkv"](x + model["wte"](tokens))
            q, k, v = h.view(2, 128, 3, 4, 16).permute(2, 0, 3, 1, 4)
            # causal SDPA, as Hugging Face's GPT-2 runs it: memory-efficient in fp32, flash in bf16
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            loss = model["out"](y.transpose(1, 2).reshape(2, 128, 64)).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def outside_allocator(precision: str) -> tuple[int, dict[str, int]]:
    result = estimate(attention_job, precision, gpu="h200", torch_version="2.11.0", steps=2)
    assert result.peak_bytes == result.context_bytes + result.library_bytes + result.peak_reserved_bytes
    return result.context_bytes + result.library_bytes, result.libraries


def measured_context(gpu: str, args: str) -> int:
    import csv

    with open(REPO / "benchmarks" / "groundtruth" / f"{gpu}.csv", newline="") as fh:
        found = {int(r["context_bytes"]) for r in csv.DictReader(fh) if r["args"] == args}
    assert len(found) == 1, found
    return found.pop()


def test_bf16_attention_job_differs_from_fp32_by_the_measured_amount():
    (fp32, fp32_families), (bf16, bf16_families) = outside_allocator("fp32"), outside_allocator("bf16")
    assert set(fp32_families) == {"torch_kernels", "cublas_gemm", "sdpa_efficient"}
    assert set(bf16_families) == {"torch_kernels", "cublas_gemm", "sdpa_flash", "bf16_gemm"}
    assert fp32 == 742 * MiB  # what every fp32 GPT-2 / BERT run on the H200 measured
    # GPT-2 with SDPA on the H200: the same job measured in fp32 and bf16 (autocast)
    args = "--seq-len 512 --model gpt2 --precision {} --batch-size 32"
    measured = measured_context("h200", args.format("bf16")) - measured_context(
        "h200", args.format("fp32")
    )
    assert measured == 16 * MiB
    assert bf16 - fp32 == measured


def free_before_and_after_a_matmul(readings: list[int]) -> None:
    torch.cuda.init()
    readings.append(torch.cuda.mem_get_info()[0])
    a = torch.randn(64, 64, device="cuda")
    (a @ a).sum()
    readings.append(torch.cuda.mem_get_info()[0])


def test_mem_get_info_in_a_capture_counts_the_families_run_so_far():
    readings: list[int] = []
    estimate(free_before_and_after_a_matmul, readings, gpu="h200", torch_version="2.11.0", steps=1)
    before, after = readings
    # the first GEMM: its 16 KiB output in a new 2 MiB segment, cuBLAS's 32 MiB workspace (from
    # the allocator) and, outside the allocator, cuBLAS's 128 MiB of pages
    workspace = load_stack("2.11.0").cublas_workspace_for((9, 0)).value
    assert before - after == 2 * MiB + workspace + 128 * MiB


def test_the_context_at_creation_counts_the_families_as_lazily_loaded():
    from peakmem.baselines.peakmem_estimator import context_at_creation_bytes

    result = estimate(attention_job, "fp32", gpu="h100-80gb", torch_version="2.11.0", steps=1)
    # 742 MiB outside the allocator less the 224 MiB the H100 probe saw load after creation:
    # the 518 MiB it read right after context creation (h100-80gb_context.json)
    assert result.context_bytes + result.library_bytes == 742 * MiB
    assert context_at_creation_bytes(result) == 518 * MiB


def test_every_measured_h200_and_h100_run_against_the_model():
    """The check of docs/context.md on the committed captures of each class of job
    (benchmarks/results/context_ops.json, written by benchmarks/score_context.py). The H200 rows
    of the 2026-11-27 21:31 lease (measured_at from 16:00Z, all held out) are not all within
    NVML's 2 MiB step: the misses are stated here, not fitted."""
    import json
    import re

    import pandas as pd

    cache = json.loads((REPO / "benchmarks" / "results" / "context_ops.json").read_text())
    stack = load_stack("2.11.0")
    misses: dict[str, dict[str, list[int]]] = {"h200": {}, "h100-80gb": {}}
    later: list[int] = []  # the H200 rows measured from 16:00Z
    for name, found in misses.items():
        gpu = load_gpu(name)
        runs = pd.read_csv(REPO / "benchmarks" / "groundtruth" / f"{name}.csv").fillna({"args": ""})
        for run in runs[runs["status"] == "ok"].itertuples():
            args = " ".join(re.sub(r"--batch-size \d+", "", run.args).split())
            key = f"{Path(run.job).name} {args}".strip()
            seen = cache[key]
            if "error" in seen:  # detection.py: torchvision's C ops do not load here
                continue
            libraries = sum(stack.library_bytes_for(gpu, lib).value for lib in seen["libraries"])
            families = sum(first_use_bytes(stack, gpu, seen["ops"]).values())
            miss = stack.context_for(gpu).value + libraries + families - run.context_bytes
            found.setdefault(key, []).append(miss)
            if name == "h200" and run.measured_at >= "2026-11-27T16":
                later.append(miss)
    h200 = [m for ms in misses["h200"].values() for m in ms]
    assert len(h200) == 324 and len(later) == 183  # 330 rows less 6 of detection.py
    assert sum(abs(m) <= 2 * MiB for m in h200) - sum(abs(m) <= 2 * MiB for m in later) == 141
    over = {key: sorted(set(ms)) for key, ms in misses["h200"].items()
            if any(abs(m) > 2 * MiB for m in ms)}  # fmt: skip
    assert sum(abs(m) <= 2 * MiB for m in later) == 173
    # a conv stem + attention: 2-4 MiB under the model. (The bf16 MLP / DLRM runs, 16-18 MiB
    # over while bf16_gemm counted any bf16 GEMM, are within 2 MiB since it needs an embedding.)
    assert over == {
        "vision.py --model swin_t --precision bf16": [4 * MiB],
        "vision.py --model vit_b_16 --precision fp32": [4 * MiB],
    }
    h100 = [m for ms in misses["h100-80gb"].values() for m in ms]
    assert len(h100) == 64 and max(map(abs, h100)) == 4 * MiB
    assert sum(abs(m) > 2 * MiB for m in h100) == 2  # ViT-B/16, Swin-T at 64 px
