"""A user's directory tree to run file-changing jobs in, and its exact state (for "as it was")."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under `root`: directories, files (content hash, permission bits), symlinks."""
    state: dict[str, tuple] = {}
    for directory, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(directory, name)
            info = path.lstat()
            relative = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                state[relative] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                state[relative] = ("dir",)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                state[relative] = ("file", digest, stat.S_IMODE(info.st_mode))
    return state


def user_tree(root: Path) -> Path:
    """A working directory holding the user's earlier results: logs, a checkpoint, data."""
    work = root / "work"
    (work / "runs" / "checkpoint-1").mkdir(parents=True)
    (work / "runs" / "checkpoint-1" / "trainer_state.json").write_text('{"step": 1}')
    (work / "runs" / "checkpoint-1" / "weights.bin").write_bytes(os.urandom(4096))
    (work / "runs" / "train.log").write_text("epoch 0 loss 1.0\n")
    (work / "old.txt").write_text("the user's notes\n")
    (work / "config.json").write_text('{"lr": 0.1}')
    (work / "data").mkdir()
    (work / "data" / "big.bin").write_bytes(os.urandom(1 << 16))
    (work / "data" / "keep.txt").write_text("data\n")
    os.chmod(work / "config.json", 0o640)
    os.symlink("runs/checkpoint-1", work / "latest")
    return work


CHANGES = """
import json, os, shutil
os.makedirs("runs/checkpoint-2", exist_ok=True)
with open("runs/checkpoint-2/trainer_state.json", "w") as f:
    json.dump({"step": 2}, f)
with open("runs/train.log", "a") as f:
    f.write("epoch 1 loss 0.5\\n")
with open("runs/train.log") as f:
    assert f.read().endswith("epoch 1 loss 0.5\\n")
with open("config.json", "w") as f:
    f.write('{"lr": 0.2}')
with open("config.json") as f:
    assert f.read() == '{"lr": 0.2}'
os.truncate("data/keep.txt", 1)
os.rename("old.txt", "renamed.txt")
with open("renamed.txt", "a") as f:
    f.write("appended after the rename\\n")
os.replace("runs/checkpoint-2/trainer_state.json", "runs/checkpoint-1/trainer_state.json")
os.remove("data/big.bin")
shutil.rmtree("runs/checkpoint-1")
os.unlink("latest")
os.symlink("runs/checkpoint-2", "latest")
os.chmod("data/keep.txt", 0o600)
with open("new.log", "w") as f:
    f.write("a log the job wrote\\n")
assert open("new.log").read() == "a log the job wrote\\n"
"""
"""Python statements (run in the tree's root) that create, append, overwrite, truncate,
rename, replace, remove and rmtree the user's paths, and read back what they wrote."""
