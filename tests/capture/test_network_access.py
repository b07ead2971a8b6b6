"""Downloads without network access (capture.network_access): the one-line error names the host
the job could not reach and what to do; a job that survives the failure gets a note."""

from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.estimate import EstimateError, estimate_command

HOST = "weights.peakmem-test.invalid"  # RFC 6761: .invalid never resolves

DOWNLOADS = f"""\
import sys
import urllib.request
import torch

model = torch.nn.Linear(64, 64).cuda()
try:
    urllib.request.urlopen("http://{HOST}/model.pth", timeout=5)
except OSError:
    if "--fail" in sys.argv:
        raise
    print("no pretrained weights: training from scratch")
if "--type-error" in sys.argv:  # the job's own bug, after a download it went on without
    model(torch.randn(8, 64, device="cuda"), 1)
model(torch.randn(8, 64, device="cuda")).sum().backward()
"""


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "downloads.py").write_text(DOWNLOADS)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_failed_download_names_the_host_in_one_line(workdir):
    with pytest.raises(EstimateError) as failed:
        estimate_command(["python", "downloads.py", "--fail"], gpu="a100-40gb", mode="fake",
                         timeout=120)
    message = failed.value.message
    assert message.startswith("the job raised URLError")
    assert f"it could not reach {HOST}: there is no network access here" in message
    assert "pretrained weights" in message and "\n" not in message


def test_a_later_programming_error_gets_no_network_hint(workdir):
    """A job that survived the failed lookup (a library tried the hub and went on) and then
    failed with a TypeError of its own: the one-line error is the TypeError alone; the note
    still names the host (round 20a: SparseEncoder's lookup, then an unrelated failure)."""
    with pytest.raises(EstimateError) as failed:
        estimate_command(["python", "downloads.py", "--type-error"], gpu="a100-40gb",
                         mode="fake", timeout=120)
    message = failed.value.message
    assert message.startswith("the job raised TypeError"), message
    assert "could not reach" not in message and "no network access" not in message
    notes = failed.value.capture.notes
    assert any(note.startswith(f"the job could not reach {HOST}") for note in notes), notes


def test_a_job_that_goes_on_without_the_download_gets_a_note(workdir):
    result = estimate_command(["python", "downloads.py"], gpu="a100-40gb", mode="fake",
                              timeout=120)
    assert result.peak_allocated_bytes >= 64 * 64 * 4
    assert any(note.startswith(f"the job could not reach {HOST}") for note in result.notes), (
        result.notes)


@pytest.mark.skipif(__import__("importlib").util.find_spec("datasets") is None,
                    reason="needs datasets")
def test_load_dataset_from_local_files_gets_no_network_note(workdir, monkeypatch):
    # datasets HEADs s3.amazonaws.com to count the load (a usage ping, its failure swallowed):
    # nothing the job needs was left undownloaded
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(workdir / "hf"))
    (workdir / "rows.csv").write_text("text,label\nabc,0\ndef,1\n")
    (workdir / "local_csv.py").write_text(
        "import torch\nfrom datasets import load_dataset\n"
        "ds = load_dataset('csv', data_files='rows.csv')['train']\n"
        "model = torch.nn.Linear(64, 64).cuda()\n"
        "model(torch.randn(len(ds), 64, device='cuda')).sum().backward()\n")
    result = estimate_command(["python", "local_csv.py"], gpu="a100-40gb", mode="fake",
                              timeout=120)
    assert result.peak_allocated_bytes >= 64 * 64 * 4
    assert not any("could not reach" in note for note in result.notes), result.notes
