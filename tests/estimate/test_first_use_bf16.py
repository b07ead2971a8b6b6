"""Which bf16 jobs load the 16 MiB more outside the allocator than the same job in fp32
(first-use family `bf16_dropout`, estimate/first_use.py): the H200 runs of 2026-11-27 measured it
for bf16 Transformers (GPT-2, BERT, T5: bf16 dropout) and not for bf16 MLPs (bf16 GEMMs, casts
and activations, no dropout)."""

import csv
from pathlib import Path

import torch

from peakmem.estimate import estimate

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def mlp_job(precision: str, dropout: float) -> None:
    # benchmarks/zoo/mlp.py in small: Linear + ReLU (+ dropout), cross entropy, Adam, autocast
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(512, 10)
    ).cuda()
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.randn(64, 256, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    for _ in range(2):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def outside_allocator(precision: str, dropout: float = 0.0) -> tuple[int, set[str]]:
    result = estimate(mlp_job, precision, dropout, gpu="h200", torch_version="2.11.0", steps=2)
    return result.context_bytes + result.library_bytes, set(result.libraries)


def measured_mlp_contexts(precision: str) -> dict[str, int]:
    """context_bytes of the H200 mlp.py runs of the 2026-11-27 21:31 lease, by hidden size and
    batch."""
    found = {}
    with open(REPO / "benchmarks" / "groundtruth" / "h200.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["job"].endswith("mlp.py") and f"--precision {precision}" in row["args"]:
                found[row["args"].replace(f"--precision {precision} ", "")] = int(row["context_bytes"])
    return found


def test_bf16_mlp_without_dropout_loads_what_fp32_does():
    fp32, bf16 = measured_mlp_contexts("fp32"), measured_mlp_contexts("bf16")
    assert len(bf16) == 12 and bf16.keys() == fp32.keys()
    # measured: the bf16 runs no higher than the same runs in fp32 (NVML's 2 MiB step below)
    assert {bf16[k] - fp32[k] for k in bf16} <= {0, -2 * MiB}
    (est_fp32, fp32_families), (est_bf16, bf16_families) = outside_allocator("fp32"), outside_allocator("bf16")
    assert est_bf16 == est_fp32 == 740 * MiB  # base 610 + torch_kernels 2 + cuBLAS 128
    assert bf16_families == fp32_families == {"torch_kernels", "cublas_gemm"}
    assert all(abs(est_bf16 - m) <= 2 * MiB for m in bf16.values())


def test_bf16_dropout_adds_the_transformers_16_mib():
    (plain, _), (dropping, families) = outside_allocator("bf16"), outside_allocator("bf16", 0.1)
    assert "bf16_dropout" in families
    assert dropping - plain == 18 * MiB  # the split's choice: bf16 Transformers - 742 MiB base
    (fp32_dropping, fp32_families) = outside_allocator("fp32", 0.1)
    assert "bf16_dropout" not in fp32_families and fp32_dropping == plain
