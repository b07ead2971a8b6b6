import json
import textwrap

from click.testing import CliRunner

from peakmem.cli.main import main

SMALL = ["--in-features", "32", "--hidden", "64", "--depth", "2", "--batch-size", "16", "--samples", "64"]


def run(*args):
    return CliRunner().invoke(main, ["estimate", *args], catch_exceptions=False)


def test_json_output_for_the_bundled_example():
    result = run("--gpu", "a100-40gb", "--torch", "2.4.1", "--json", "--", "python", "-m",
                 "peakmem.examples.mlp_train", *SMALL)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["gpu"] == "a100-40gb" and payload["fits"] is True
    assert payload["peak_bytes"] == payload["context_bytes"] + payload["peak_reserved_bytes"]
    # one epoch of 4 batches + 2 steps, then the loop is ended: epoch 2 skips to its last batch
    assert payload["steps"] == 7 and payload["estimate_kind"] == "training"
    assert any(note.startswith("training loop ended early after 6 optimizer steps (in epoch 2)")
               for note in payload["notes"])
    assert "epoch 0 step 0" not in result.stdout  # the job's prints stay off stdout


def test_table_output_and_timeline(tmp_path):
    timeline = tmp_path / "timeline.html"
    result = run("--gpu", "l4", "--timeline", str(timeline), "--", "python", "-m",
                 "peakmem.examples.mlp_train", *SMALL)
    assert result.exit_code == 0, result.output
    assert "Peak device memory" in result.stdout and "Fits" in result.stdout
    assert "optimizer_state" in result.stdout
    assert "<svg" in timeline.read_text()


def test_unknown_gpu_is_a_one_line_usage_error():
    result = run("--gpu", "gtx-9000", "--", "python", "-m", "peakmem.examples.mlp_train")
    assert result.exit_code == 2
    assert "unknown GPU 'gtx-9000'" in result.output and "rtx4090" in result.output
    assert "Traceback" not in result.output


def test_failing_script_shows_its_traceback_and_exits_non_zero(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, 4).cuda()
        model(torch.randn(2, 5, device="cuda"))
    """))
    result = run("--gpu", "l4", "--", "python", str(script))
    assert result.exit_code == 1
    assert "train.py" in result.output and "RuntimeError" in result.output


def test_json_says_which_mode_ran_and_why():
    result = run("--gpu", "l4", "--json", "--mode", "eager", "--", "python", "-m",
                 "peakmem.examples.mlp_train", *SMALL)
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["mode"] == "eager" and "eager" in payload["mode_reason"]


def test_png_timeline(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    timeline = tmp_path / "timeline.png"
    result = run("--gpu", "l4", "--timeline", str(timeline), "--json", "--", "python", "-m",
                 "peakmem.examples.mlp_train", *SMALL)
    assert result.exit_code == 0, result.output
    assert timeline.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
