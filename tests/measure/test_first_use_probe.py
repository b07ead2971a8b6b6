"""benchmarks/first_use_probe.py without a GPU: the plan, the dry run, and every family's stages
run for real on the CPU (readings are 0 there) so a typo cannot wait for the GPU session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import first_use_probe as fu  # noqa: E402

from peakmem.measure.cudnn_tables import FIRST_USE_COLUMNS, read_first_use  # noqa: E402

# the families the issue names, each must be there
REQUIRED = [
    "conv_tf32", "conv_fp32", "conv_bf16", "conv_fp16", "batch_norm_fp32", "dropout_fp32",
    "max_pool2d_fp32", "avg_pool2d_fp32", "adaptive_avg_pool2d_fp32", "mm_fp32", "mm_tf32",
    "mm_bf16", "addmm_fp32", "bmm_bf16", "sdpa_flash_bf16", "sdpa_efficient_bf16",
    "sdpa_math_bf16", "embedding_fp32", "cross_entropy_fp32", "layer_norm_fp32",
    "adamw_foreach", "adamw_fused", "sgd_foreach",
] + [f"{a}_fp32" for a in fu.ACTIVATIONS]  # fmt: skip
CPU_UNSUPPORTED = {"sdpa_efficient_bf16", "sdpa_efficient_fp32", "sdpa_cudnn_bf16"}


def test_families_cover_the_issue():
    assert set(REQUIRED) <= set(fu.FAMILIES)
    assert set(fu.DEFAULT_ISOLATE) <= set(fu.FAMILIES)
    assert {"relu", "gelu", "silu", "mish", "tanh", "sigmoid", "elu", "selu", "softplus",
            "leaky_relu", "prelu", "hardswish"} == set(fu.ACTIVATIONS)  # fmt: skip


def test_plan_sequence_then_isolated():
    args = fu.argparse.Namespace(modes="LAZY,EAGER", isolate="relu_fp32,conv_tf32")
    processes = fu.plan(args)
    assert [(run, mode) for run, mode, _ in processes] == [
        ("sequence", "LAZY"),
        ("sequence", "EAGER"),
        ("isolated", "LAZY"),
        ("isolated", "LAZY"),
    ]
    assert processes[0][2][0] == "common" and len(processes[0][2]) == len(fu.FAMILIES)
    assert processes[2][2] == ["common", "relu_fp32"]
    with pytest.raises(SystemExit):
        fu.plan(fu.argparse.Namespace(modes="LAZY", isolate="nope"))


def test_dry_run_writes_the_header(tmp_path, capsys):
    assert fu.main([str(tmp_path), "--dry-run"]) == 0
    assert (tmp_path / fu.TABLE).read_text().strip() == ",".join(FIRST_USE_COLUMNS)
    assert read_first_use(tmp_path / fu.TABLE).empty
    assert "processes" in capsys.readouterr().out


def test_every_family_runs_on_cpu():
    import torch

    families = ["common", *[f for f in fu.FAMILIES if f != "common"]]
    try:
        rows = fu.run_process(torch, "cpu", families, "sequence", 0, small=True)
    finally:
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = False
    assert rows[0]["family"] == "context" and rows[0]["stage"] == "init"
    assert [r["order"] for r in rows] == list(range(len(rows)))
    bad = {(r["family"], r["stage"], r["error"][:80]) for r in rows
           if r["status"] != "ok" and r["family"] not in CPU_UNSUPPORTED}  # fmt: skip
    assert not bad
    seen = {r["family"] for r in rows}
    assert seen == {"context", *families}
    for fam in set(families) - CPU_UNSUPPORTED:
        stages = [(r["stage"], r["call"]) for r in rows if r["family"] == fam]
        assert stages[0] == ("setup", 1) and len(stages) >= 3, (fam, stages)
        assert all(call in (1, 2) for _, call in stages)
    for fam in CPU_UNSUPPORTED:
        statuses = [r["status"] for r in rows if r["family"] == fam]
        assert statuses[-1] == "unsupported"


def test_cpu_mode_writes_a_readable_table(tmp_path):
    assert fu.main([str(tmp_path), "--device", "cpu", "--small", "--isolate", "none",
                    "--modes", "LAZY"]) == 0  # fmt: skip
    table = read_first_use(tmp_path / fu.TABLE)
    assert len(table) > 100 and table["outside_delta_bytes"].eq(0).all()
    assert table["call"].dtype == "int64"


def test_measure_reads_outside_the_allocator():
    class FakeReader(fu.Reader):
        def __init__(self):
            self.readings = iter([(1000, 200), (1500, 300)])  # (used, reserved) before, after
            self.pre_init_used = 100
            self._nvml = None

        def sync(self):
            pass

        def used(self):
            self._last = next(self.readings)
            return self._last[0]

        def reserved(self):
            return self._last[1]

        def allocated(self):
            return 0

        def peak_allocated(self):
            return 0

        def reset_peak(self):
            pass

    reading = fu.measure(FakeReader(), lambda: None)
    assert reading["outside_before_bytes"] == 1000 - 200 - 100
    assert reading["outside_after_bytes"] == 1500 - 300 - 100
    assert reading["outside_delta_bytes"] == 400
    failed = fu.measure(
        FakeReader(), lambda: (_ for _ in ()).throw(RuntimeError("No available kernel"))
    )
    assert failed["status"] == "unsupported"


def test_next_lease_isolate_list():
    assert set(fu.NEXT_LEASE_ISOLATE) <= set(fu.FAMILIES)
    processes = fu.plan(fu.argparse.Namespace(modes="", isolate="next"))
    assert [run for run, _, _ in processes] == ["isolated"] * len(fu.NEXT_LEASE_ISOLATE)
    assert [fams for _, _, fams in processes][:2] == [["common", "addmm_bf16"],
                                                      ["common", "mm_bf16"]]  # fmt: skip


def _aten_calls(torch, stages):
    """(op name, args) of every aten call the stages make, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append((func.overloadpacket.__name__, args))
            return func(*args, **(kwargs or {}))

    with Record():
        for _, stage in stages:
            stage()
    return calls


def test_patch_stem_backward_computes_no_input_gradient():
    import torch

    stem = _aten_calls(torch, fu.FAMILIES["conv_stem_nograd_tf32"](torch, "cpu", True))
    full = _aten_calls(torch, fu.FAMILIES["conv_tf32"](torch, "cpu", True))
    torch.backends.cudnn.allow_tf32 = True
    # convolution_backward's output_mask (grad_input, grad_weight, grad_bias)
    (stem_mask,) = [args[-1] for op, args in stem if op == "convolution_backward"]
    (full_mask,) = [args[-1] for op, args in full if op == "convolution_backward"]
    assert list(stem_mask) == [False, True, True] and list(full_mask) == [True, True, True]
    (stride,) = {tuple(args[3]) for op, args in stem if op == "convolution"}
    assert stride == (16, 16)


def test_autocast_families_run_their_gemms_in_bf16():
    import torch

    for name, attention in (("transformer_block_autocast_bf16", True),
                            ("mlp_autocast_bf16", False)):  # fmt: skip
        calls = _aten_calls(torch, fu.FAMILIES[name](torch, "cpu", True))
        gemms = [args for op, args in calls if op in ("addmm", "mm", "linear")]
        assert gemms and all(a.dtype == torch.bfloat16 for args in gemms for a in args
                             if isinstance(a, torch.Tensor))  # fmt: skip
        ops = {op for op, _ in calls}  # SDPA: the math backend's softmax on the CPU
        assert any("softmax" in op or "attention" in op for op in ops) == attention, sorted(ops)
    fp32 = _aten_calls(torch, fu.FAMILIES["mlp_autocast_fp32"](torch, "cpu", True))
    assert {a.dtype for op, args in fp32 if op == "addmm" for a in args} == {torch.float32}
