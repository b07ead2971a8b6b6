"""benchmarks/gpumemnet_across_gpus.py: the public GPUMemNet rows (A100) joined with their H200
re-measures, and the table's arithmetic."""

import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MiB = 1 << 20


def load():
    spec = importlib.util.spec_from_file_location(
        "gpumemnet_across_gpus", BENCHMARKS / "gpumemnet_across_gpus.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpumemnet_across_gpus"] = module
    spec.loader.exec_module(module)
    return module


across = load()


def test_every_h200_remeasure_joins_its_public_row(shared_data):
    public = across.public_by_config(shared_data)
    ours = across.remeasured("h200")
    assert len(ours) == 44  # the 2026-11-27 21:31 lease
    assert set(ours) <= set(public)
    config = "input:1259_output:79_depth:8_arch:pyramid_batch:717"
    assert public[config].measured_peak_bytes == 1479 * MiB  # the sweep file's comment
    assert ours[config].features["measured_peak_bytes"] == "897581056"


def entry(a100_peak, a100_outside, a100_reserved, h200_peak, h200_context, h200_reserved):
    return {
        "family": "mlp-pyramid",
        "a100": {"measured": a100_peak * MiB, "status": "ok",
                 "estimate": {"peak": a100_peak * MiB, "reserved": a100_reserved * MiB,
                              "outside": a100_outside * MiB}},
        "h200": {"measured": h200_peak * MiB, "reserved": (h200_peak - h200_context) * MiB,
                 "context": h200_context * MiB,
                 "estimate": {"peak": (h200_peak + 2) * MiB, "reserved": h200_reserved * MiB,
                              "outside": 740 * MiB}},
    }


def test_the_table_subtracts_each_gpus_outside_memory():
    results = {
        "input:1259_output:79_depth:8_arch:pyramid_batch:717": entry(1479, 1429, 50, 856, 742, 114),
        "num_classes:576_embedding_size:128_num_layers:4_num_heads:8_ff_hidden_size:402_"
        "dropout_rate:0.3_seq_length:512_input_size:96304_num_samples:3260_batch_size:8":
            entry(1893, 1429, 464, 1252, 742, 510),
    }
    lines = across.table(results)
    assert lines[2] == ("| mlp 1259-79 d8 pyramid b717 | 1479 | 1479 | 50 | 856 | 858 | 114 | -623 |"
                        " +64 |")
    assert lines[3].startswith("| tf E128 L4 S512 B8 | 1893 | 1893 | 464 | 1252 | 1254 | 510 |")
    summary = lines[5]
    assert "H200 - A100 measured peak: median -632 MiB, range -641 to -623 MiB" in summary
    assert "less the memory outside the allocator: median +55 MiB, range +46 to +64 MiB" in summary
    assert "estimated peak reserved H200 - A100: median +55 MiB" in summary
    assert lines[7] == ("h200 estimate - measured peak: median +2 MiB, range +2 to +2 MiB,"
                        " within 2 MiB 2/2")
