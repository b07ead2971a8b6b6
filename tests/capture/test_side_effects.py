"""Saves of fake device data made during a capture never overwrite real files."""

import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from peakmem.capture import capture_callable
from peakmem.capture.side_effects import (
    divert_fake_saves,
    holds_fake_device_data,
    scratch_name,
    user_path,
)

REAL = b"the user's real checkpoint\n" * 10


def _model():
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


@pytest.fixture(autouse=True)
def kept_scratch(tmp_path_factory, monkeypatch):
    """The tests below read the diverted copies after the capture: kept, in a test folder."""
    from peakmem.capture import side_effects

    monkeypatch.setattr(side_effects, "KEEP_SCRATCH", True)
    monkeypatch.setattr(side_effects, "SCRATCH_PARENT", tmp_path_factory.mktemp("saves"))


@pytest.fixture
def real_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def make(name):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(REAL)
        return path

    return make


def _diverted_note(result):
    notes = [n for n in result.notes if "fake device data" in n]
    assert len(notes) == 1, result.notes
    return notes[0]


def _scratch_of(note):
    return note.split(" to ", 1)[1].split(" instead of ", 1)[0]


def test_torch_save_of_a_device_state_dict_does_not_overwrite_the_real_file(
    a100, stack24, real_file
):
    ckpt = real_file("ckpt/model.pt")

    def job():
        model = _model().cuda()
        torch.save(model.state_dict(), str(ckpt))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert ckpt.read_bytes() == REAL
    note = _diverted_note(result)
    assert "the job saved 1 file(s) of fake device data" in note
    assert str(ckpt) in note
    diverted = os.path.join(_scratch_of(note), "ckpt", "model.pt")  # its relative name kept
    loaded = torch.load(diverted)
    assert set(loaded) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert loaded["0.weight"].is_meta


@pytest.mark.parametrize("what", ["model", "optimizer", "nested"])
def test_models_optimizers_and_nested_checkpoints_are_diverted(a100, stack24, real_file, what):
    ckpt = real_file("last.ckpt")

    def job():
        model = _model().to("cuda")
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(2, 8, device="cuda")).sum().backward()
        opt.step()
        obj = {
            "model": model,
            "optimizer": opt.state_dict(),
            "nested": {"epoch": 3, "states": [("m", model.state_dict())], "args": {"lr": 1}},
        }[what]
        torch.save(obj, ckpt)  # a Path

    result = capture_callable(job, gpu=a100, stack=stack24, steps=None)
    assert result.error is None, result.error_text
    assert ckpt.read_bytes() == REAL
    assert str(ckpt) in _diverted_note(result)


def test_host_only_saves_go_through(a100, stack24, real_file):
    ckpt = real_file("host.pt")
    log = real_file("log.csv")

    def job():
        torch.save({"w": torch.ones(3), "step": 1}, ckpt)
        np.save(log.with_suffix(".npy"), np.arange(4))
        log.write_text("step,loss\n1,0.5\n")
        model = _model().cuda()
        model(torch.randn(2, 8, device="cuda"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert torch.load(ckpt)["w"].tolist() == [1.0, 1.0, 1.0]
    assert np.load(log.with_suffix(".npy")).tolist() == [0, 1, 2, 3]
    assert log.read_text() == "step,loss\n1,0.5\n"
    assert not [n for n in result.notes if "fake device data" in n]


def test_host_copies_of_device_tensors_are_fake_data(a100, stack24, real_file):
    """`.cpu()` answers with placeholder zeros: saving them would also destroy the file."""
    ckpt = real_file("cpu.pt")
    arr = real_file("act.npy")

    def job():
        model = _model().cuda()
        torch.save(model.cpu().state_dict(), ckpt)
        out = torch.randn(2, 8, device="cuda") * 2
        np.save(arr, out.cpu().numpy())

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert ckpt.read_bytes() == REAL and arr.read_bytes() == REAL
    note = _diverted_note(result)
    assert "saved 2 file(s)" in note and str(ckpt) in note and str(arr) in note


def test_numpy_saves_of_device_tensors_are_diverted(a100, stack24, real_file):
    npy = real_file("x.npy")
    npz = real_file("x.npz")
    txt = real_file("x.txt")

    def job():
        t = torch.randn(3, 4, device="cuda")
        np.save(npy, t)
        np.savez(npz, a=np.arange(2), b=t.cpu().numpy())
        np.savez_compressed(str(npz), np.asarray(t))
        np.savetxt(txt, t.detach().cpu().numpy())

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    for path in (npy, npz, txt):
        assert path.read_bytes() == REAL
    assert "saved 4 file(s)" in _diverted_note(result)


def test_safetensors_saves_are_diverted_and_readable(a100, stack24, real_file):
    from safetensors import safe_open

    st = real_file("model.safetensors")
    st2 = real_file("sub/m2.safetensors")

    def job():  # a script imports them by name during the capture
        from safetensors.torch import save_file, save_model

        model = _model().cuda()
        save_file(model.state_dict(), st, metadata={"format": "pt"})
        save_model(model, str(st2))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert st.read_bytes() == REAL and st2.read_bytes() == REAL
    note = _diverted_note(result)
    assert "saved 2 file(s)" in note
    diverted = os.path.join(_scratch_of(note), "model.safetensors")
    with safe_open(diverted, framework="pt") as f:
        assert sorted(f.keys()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        assert f.get_tensor("0.weight").shape == (4, 8)
        assert f.metadata() == {"format": "pt"}
    with safe_open(os.path.join(_scratch_of(note), "sub", "m2.safetensors"), "pt") as f:
        assert f.get_tensor("2.weight").abs().sum() == 0


def test_a_module_that_imported_save_file_by_name_is_covered(a100, stack24, real_file):
    """HF modeling_utils does `from safetensors.torch import save_file as safe_save_file`."""
    from peakmem.capture import vision_ops

    vision_ops.declare_torchvision_ops()  # transformers may import torchvision
    import transformers.modeling_utils as mu

    st = real_file("hf/model.safetensors")

    def job():
        mu.safe_save_file(_model().cuda().state_dict(), str(st), metadata={"format": "pt"})

    before = mu.safe_save_file
    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert st.read_bytes() == REAL
    assert str(st) in _diverted_note(result)
    assert mu.safe_save_file is before  # restored afterwards


def test_hf_save_pretrained(a100, stack24, real_file, tmp_path):
    weights = real_file("out/model.safetensors")

    def job():
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
        model = GPT2LMHeadModel(config).cuda()
        model.save_pretrained(tmp_path / "out")

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert weights.read_bytes() == REAL
    assert str(weights) in _diverted_note(result)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["n_layer"] == 1


def test_lightning_atomic_save(a100, stack24, real_file):
    """Trainer.save_checkpoint -> TorchCheckpointIO (bound `_atomic_save` by name before the
    capture) -> torch.save to a buffer, then fsspec writes the file."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    ckpt = real_file("lightning/epoch=0.ckpt")

    def job():
        checkpoint = {"state_dict": _model().cuda().state_dict(), "epoch": 0}
        TorchCheckpointIO().save_checkpoint(checkpoint, str(ckpt))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert ckpt.read_bytes() == REAL
    assert "saved 1 file(s)" in _diverted_note(result)  # its inner torch.save is not counted


def test_lightning_reads_back_a_checkpoint_it_saved_where_none_was(a100, stack24, tmp_path,
                                                                    monkeypatch):
    """`trainer.test(ckpt_path="best")` after `fit`: TorchCheckpointIO.load_checkpoint checks
    that the file exists (fsspec) before it opens it; the save was diverted, so the check looks
    at the diverted copy ("Checkpoint file not found" before)."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

    monkeypatch.chdir(tmp_path)
    ckpt = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "epoch=0-step=4.ckpt"
    ckpt.parent.mkdir(parents=True)
    seen = {}

    def job():
        io_ = TorchCheckpointIO()
        io_.save_checkpoint({"state_dict": _model().cuda().state_dict(), "epoch": 3}, str(ckpt))
        loaded = io_.load_checkpoint(str(ckpt))
        seen["epoch"], seen["keys"] = loaded["epoch"], sorted(loaded["state_dict"])

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"epoch": 3, "keys": ["0.bias", "0.weight", "2.bias", "2.weight"]}
    assert not ckpt.exists()  # the fake checkpoint went to the scratch directory only
    assert vars(TorchCheckpointIO)["load_checkpoint"].__name__ == "load_checkpoint"
    assert not hasattr(vars(TorchCheckpointIO)["load_checkpoint"], "__wrapped__")  # restored


def test_file_objects(a100, stack24, real_file):
    """In-memory buffers are the job's own; a real file opened for writing is diverted."""
    ckpt = real_file("handle.pt")
    seen = {}

    def job():
        state = _model().cuda().state_dict()
        buffer = io.BytesIO()
        torch.save(state, buffer)
        seen["buffer"] = len(buffer.getvalue())
        with open(ckpt, "r+b") as handle:
            torch.save(state, handle)

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["buffer"] > 0
    assert ckpt.read_bytes() == REAL
    assert "saved 1 file(s)" in _diverted_note(result)


def test_a_job_reads_back_a_save_through_handles_it_opened(a100, stack24, real_file):
    """pytorch/examples word_language_model: `with open(path, "wb") as f: torch.save(model, f)`
    then `with open(path, "rb") as f: model = torch.load(f)`. The job's own "wb" emptied the
    file; its read handle gets the diverted copy (a whole module, numpy too), not EOFError."""
    ckpt = real_file("model.pt")
    seen = {}

    def job():
        model = torch.nn.LSTM(8, 8, 2).cuda()
        with open(ckpt, "wb") as f:
            torch.save(model, f)
        with open(ckpt, "rb") as f:
            loaded = torch.load(f, weights_only=False)
            seen["rest"] = f.read()
        seen["model"] = (type(loaded).__name__, loaded.weight_hh_l1.shape)
        with open("act.npy", "wb") as f:
            np.save(f, torch.ones(3, device="cuda").cpu().numpy())
        with open("act.npy", "rb") as f:
            seen["np"] = np.load(f).shape

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"model": ("LSTM", (32, 8)), "rest": b"", "np": (3,)}
    assert ckpt.read_bytes() == b""  # what the job's own open("wb") left
    assert "saved 2 file(s)" in _diverted_note(result)


def test_saves_work_normally_after_the_capture(a100, stack24, tmp_path):
    capture_callable(lambda: torch.zeros(2, device="cuda"), gpu=a100, stack=stack24)
    path = tmp_path / "after.pt"
    torch.save({"m": torch.zeros(2, device="meta")}, path)  # no capture: written as asked
    assert torch.load(path)["m"].is_meta


def test_detection_walks_objects_and_arrays():
    meta = torch.zeros(2, device="meta")

    class Holder:
        def __init__(self):
            self.inner = [{"x": meta}]
            self.fn = lambda: None  # not picklable: the fallback walk finds it

    assert holds_fake_device_data({"a": [1, (2, meta)]})
    assert holds_fake_device_data(Holder())
    assert not holds_fake_device_data({"a": torch.ones(2), "b": np.ones(3), "c": "text"})
    assert not holds_fake_device_data(torch.nn.Linear(2, 2))
    assert holds_fake_device_data(torch.nn.Linear(2, 2, device="meta"))


def test_scratch_names_and_targets(tmp_path):
    assert scratch_name(str(tmp_path / "a" / "b.pt"), cwd=str(tmp_path)).as_posix() == "a/b.pt"
    assert scratch_name("/etc/x.pt", cwd=str(tmp_path)).as_posix() == "_abs/etc/x.pt"
    assert ".." not in scratch_name("../../up.pt", cwd=str(tmp_path)).parts
    assert user_path(io.BytesIO()) is None
    assert user_path(sys.stdout) is None
    assert user_path(tmp_path / "p.pt") == str(tmp_path / "p.pt")


def test_the_scratch_directory_can_be_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w.pt").write_bytes(REAL)
    with divert_fake_saves(scratch=tmp_path / "scratch") as diverter:
        torch.save(torch.zeros(3, device="meta"), "w.pt")
    assert (tmp_path / "w.pt").read_bytes() == REAL
    assert (tmp_path / "scratch" / "w.pt").is_file()
    assert diverter.diverted == [("w.pt", tmp_path / "scratch" / "w.pt")]


def test_a_save_module_imported_during_the_capture_is_covered(
    a100, stack24, real_file, tmp_path, monkeypatch
):
    from peakmem.capture import side_effects

    (tmp_path / "pm_saver_lib.py").write_text(
        "def dump(obj, path):\n    open(path, 'wb').write(b'overwritten')\n"
    )
    (tmp_path / "pm_saver_user.py").write_text("from pm_saver_lib import dump\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = side_effects.SaveFunction("pm_saver_lib", "dump", side_effects._arg(0, "obj"),
                                      (1, "path"))
    monkeypatch.setattr(side_effects, "SAVE_FUNCTIONS", (*side_effects.SAVE_FUNCTIONS, entry))
    out = real_file("lib.bin")

    def job():
        import pm_saver_user

        pm_saver_user.dump({"w": torch.zeros(2, device="cuda")}, str(out))

    try:
        result = capture_callable(job, gpu=a100, stack=stack24)
    finally:
        sys.modules.pop("pm_saver_lib", None)
        sys.modules.pop("pm_saver_user", None)
    assert result.error is None, result.error_text
    assert out.read_bytes() == REAL
    assert str(out) in _diverted_note(result)


def test_a_job_reads_back_what_it_saved(a100, stack24, real_file, tmp_path):
    """Save then reload (a 'best model' checkpoint): the job reads its diverted save, both for a
    new path and for one holding a real file."""
    existing = real_file("best.pt")
    new = tmp_path / "new" / "best.pt"
    seen = {}

    def job():
        from safetensors.torch import load_file, save_file

        model = _model().cuda()
        new.parent.mkdir()
        torch.save(model.state_dict(), new)
        torch.save({"model": model.state_dict(), "epoch": 2}, str(existing))
        seen["new"] = sorted(torch.load(new, map_location="cuda"))
        seen["epoch"] = torch.load(existing)["epoch"]
        save_file(model.state_dict(), "m.safetensors")
        seen["st"] = load_file("m.safetensors")["2.weight"].shape
        np.save("act", torch.ones(2, device="cuda").cpu().numpy())
        seen["np"] = np.load("act.npy").shape

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"new": ["0.bias", "0.weight", "2.bias", "2.weight"], "epoch": 2,
                    "st": (2, 4), "np": (2,)}
    assert existing.read_bytes() == REAL
    assert not new.exists() and not (tmp_path / "act.npy").exists()
    assert "saved 4 file(s)" in _diverted_note(result)


def test_the_size_of_a_diverted_save_is_its_copys(a100, stack24, real_file, tmp_path):
    """A job that logs the size of the checkpoint it has just saved (torchtune's checkpointers:
    `os.path.getsize(output_path)` after `save_file`) reads the diverted copy's size: a new
    path does not exist, a real file keeps its own; other paths are answered as they are."""
    existing = real_file("old.safetensors")
    new = tmp_path / "epoch_0" / "model.safetensors"
    seen = {}

    def job():
        from safetensors.torch import save_file

        model = _model().cuda()
        new.parent.mkdir()
        seen["before"] = os.path.getsize(existing)
        save_file(model.state_dict(), str(new))
        save_file(model.state_dict(), str(existing))
        seen["new"] = os.path.getsize(new)
        seen["existing"] = os.path.getsize(str(existing))
        with pytest.raises(FileNotFoundError):
            os.path.getsize(tmp_path / "never_saved.safetensors")

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert not new.exists() and existing.read_bytes() == REAL
    assert seen["before"] == len(REAL)
    # the header (names, dtypes, shapes) and the data section: 4 * (8*4 + 4 + 4*2 + 2) fp32
    assert seen["new"] == seen["existing"] > 4 * (32 + 4 + 8 + 2)
    scratch = _scratch_of(_diverted_note(result))
    assert seen["new"] == os.path.getsize(os.path.join(scratch, "epoch_0", "model.safetensors"))


def test_a_job_removes_or_moves_what_it_saved(a100, stack24, real_file, tmp_path):
    """A job that removes the checkpoint it saved (pytorch/examples' ddp main.py: rank 0's
    `os.remove(CHECKPOINT_PATH)` once every rank loaded it) removes the diverted copy, where
    the path itself never existed (FileNotFoundError before); a real file under a removed
    save stays. An atomic save (`torch.save(state, tmp)`, then `os.replace(tmp, path)`) moves
    the copy: `path` is read back from it, and a real file there stays."""
    existing = real_file("best.pt")
    new = tmp_path / "model.checkpoint"
    tmp = tmp_path / "ckpt.pt.tmp"
    seen = {}

    def job():
        model = _model().cuda()
        torch.save(model.state_dict(), str(new))
        seen["loaded"] = sorted(torch.load(str(new), map_location={"cuda:0": "cuda:0"}))
        os.remove(str(new))
        with pytest.raises(FileNotFoundError):  # gone, as on a GPU
            os.remove(str(new))
        torch.save(model.state_dict(), existing)
        existing.unlink()  # pathlib: os.unlink
        torch.save({"step": 3, "model": model.state_dict()}, tmp)
        os.replace(tmp, existing)
        seen["step"] = torch.load(existing)["step"]
        with pytest.raises(FileNotFoundError):
            torch.load(tmp)
        torch.save(model.state_dict(), tmp)
        Path(tmp).rename(tmp_path / "renamed.pt")  # os.rename
        seen["renamed"] = len(torch.load(tmp_path / "renamed.pt"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen == {"loaded": ["0.bias", "0.weight", "2.bias", "2.weight"], "step": 3,
                    "renamed": 4}
    assert existing.read_bytes() == REAL  # neither removed nor replaced
    assert not new.exists() and not tmp.exists() and not (tmp_path / "renamed.pt").exists()
    scratch = Path(_scratch_of(_diverted_note(result)))
    assert sorted(f.name for f in scratch.rglob("*") if f.is_file()) == ["best.pt", "renamed.pt"]


def test_accelerate_save_and_trainer_save_model(a100, stack24, real_file, tmp_path):
    acc_pt = real_file("acc.pt")
    acc_st = real_file("acc.safetensors")
    weights = real_file("saved/model.safetensors")

    def job():  # imported inside the capture, as a script does (torchvision's ops need it)
        from accelerate import Accelerator
        from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

        accelerator = Accelerator()
        state = torch.nn.Linear(4, 2).cuda().state_dict()
        accelerator.save(state, str(acc_pt))
        accelerator.save(state, str(acc_st), safe_serialization=True)
        config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=16)
        args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[])
        Trainer(model=GPT2LMHeadModel(config), args=args).save_model(str(tmp_path / "saved"))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    for path in (acc_pt, acc_st, weights):
        assert path.read_bytes() == REAL
    note = _diverted_note(result)
    assert "saved 3 file(s)" in note and str(weights) in note
    assert (tmp_path / "saved" / "config.json").is_file()  # no device data: written as asked


def test_a_later_real_save_to_the_same_path_is_read_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with divert_fake_saves(scratch=tmp_path / "scratch"):
        torch.save(torch.zeros(2, device="meta"), "x.pt")
        assert torch.load("x.pt").is_meta  # the diverted copy
        torch.save(torch.ones(2), "x.pt")  # host data: written where asked
        assert torch.load("x.pt").tolist() == [1.0, 1.0]
    assert torch.load(tmp_path / "x.pt").tolist() == [1.0, 1.0]


def test_a_save_bound_by_name_between_captures_is_covered(a100, stack24, real_file,
                                                               monkeypatch):
    """A capture finds a binding made after earlier ones (the namespace search is cached per
    namespace version: a rebinding of an existing name leaves the namespace's size as is)."""
    import types

    from safetensors.torch import save_file

    module = types.ModuleType("peakmem_test_saver")
    module.save_fn = None
    monkeypatch.setitem(sys.modules, "peakmem_test_saver", module)
    target = real_file("between.safetensors")
    for _ in range(2):  # the second search keeps the namespaces' ids
        earlier = capture_callable(lambda: torch.zeros(2, device="cuda"), gpu=a100, stack=stack24)
        assert earlier.error is None, earlier.error_text
    module.save_fn = save_file  # `from safetensors.torch import save_file as save_fn`, late

    def job():
        module.save_fn(_model().cuda().state_dict(), str(target))

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert target.read_bytes() == REAL
    assert str(target) in _diverted_note(result)
    assert module.save_fn is save_file  # restored afterwards


def test_the_scratch_directory_is_removed_after_the_capture(a100, stack24, real_file,
                                                            monkeypatch):
    from peakmem.capture import side_effects

    monkeypatch.setattr(side_effects, "KEEP_SCRATCH", False)
    ckpt = real_file("model.pt")
    seen = {}

    def job():
        model = _model().cuda()
        torch.save(model.state_dict(), str(ckpt))
        seen["state"] = set(torch.load(str(ckpt)))  # the job reads its own save back

    result = capture_callable(job, gpu=a100, stack=stack24)
    assert result.error is None, result.error_text
    assert seen["state"] == {"0.weight", "0.bias", "2.weight", "2.bias"}
    note = _diverted_note(result)
    assert "removed after the capture" in note
    assert not os.path.exists(_scratch_of(note))
    assert list(side_effects.SCRATCH_PARENT.iterdir()) == []
    assert ckpt.read_bytes() == REAL
