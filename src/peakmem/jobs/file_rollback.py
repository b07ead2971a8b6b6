"""peakmem's side of "an estimate leaves the user's files as they were": after the job's
process ended (whatever way), put back every path its journal (:mod:`peakmem.jobs.file_journal`)
names.

The journal holds one entry per path, each the path's state just before the job first changed
it: ``absent`` (created by the job), or a backup of the file, directory tree or symlink that was
there. Entries are undone newest first, so each path ends in the state of its oldest entry: the
one it had before the estimate. What the job created is removed (a directory with its contents;
symlinks are removed, never followed); what it changed, replaced or removed is put back from its
backup (moved back when on the same file system, so a hard-linked backup returns the very file).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from peakmem.jobs.file_journal import BACKUPS_NAME, JOURNAL_NAME

KEEP_ENV = "PEAKMEM_KEEP_JOB_FILES"
"""Set to 1 (``peakmem estimate --keep-job-files``): journal nothing, leave what the job wrote,
changed and removed as it left it."""
MAX_JOURNAL_BYTES = 256 << 20


@dataclass
class Rollback:
    """What the job did to the user's files and what peakmem did about it."""

    paths: int = 0
    """Paths the job created, changed or removed (outside the directories left alone)."""
    blocked: list[str] = field(default_factory=list)
    """The operations refused because no backup could be made (one line each)."""
    failed: list[str] = field(default_factory=list)
    """Paths that could not be put back, with why."""

    def notes(self) -> list[str]:
        """The lines the estimate's notes carry (none when the job changed no file)."""
        lines = []
        if self.paths:
            lines.append(f"the job wrote or changed {_count(self.paths)}; peakmem put them back "
                         "as they were before the estimate (--keep-job-files keeps them)")
        if self.blocked:
            lines.append(f"peakmem blocked {len(self.blocked)} file operation(s) of the job it "
                         f"could not back up first: {self.blocked[0]}")
        if self.failed:
            lines.append(f"peakmem could not put back {len(self.failed)} path(s) the job "
                         f"changed: {self.failed[0]}")
        return lines


def _count(paths: int) -> str:
    return f"{paths} file{'s' if paths != 1 else ''} or director{'ies' if paths != 1 else 'y'}"


def keep_job_files() -> bool:
    """Whether the user asked to keep what the job wrote (``PEAKMEM_KEEP_JOB_FILES=1``)."""
    return os.environ.get(KEEP_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def read_journal(directory: str | os.PathLike[str]) -> list[dict[str, object]]:
    """The journal's well-formed entries, oldest first (a line cut short by a killed process and
    anything malformed is skipped; nothing in it is executed)."""
    path = Path(directory) / JOURNAL_NAME
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_JOURNAL_BYTES)
    except OSError:
        return []
    entries = []
    for line in data.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and _well_formed(entry):
            entries.append(entry)
    return entries


def _well_formed(entry: dict[str, object]) -> bool:
    path = entry.get("path")
    if not isinstance(path, str) or not os.path.isabs(path) or "\0" in path:
        return False
    if "blocked" in entry:
        return isinstance(entry["blocked"], str)
    was = entry.get("was")
    if was == "absent":
        return True
    if was == "link":
        return isinstance(entry.get("target"), str)
    backup = entry.get("backup")
    return (was in ("file", "dir") and isinstance(backup, str) and backup == os.path.basename(backup)
            and backup not in ("", ".", ".."))


def roll_back(directory: str | os.PathLike[str]) -> Rollback:
    """Undo the journal in `directory`, newest entry first."""
    entries = read_journal(directory)
    report = Rollback()
    report.blocked = [f"{e['path']}: {e['blocked']}" for e in entries if "blocked" in e]
    changes = [entry for entry in entries if "blocked" not in entry]
    report.paths = len({entry["path"] for entry in changes})
    backups = Path(directory) / BACKUPS_NAME
    for entry in reversed(changes):
        path = str(entry["path"])
        try:
            _restore(entry, path, backups)
        except OSError as exc:
            report.failed.append(f"{path} ({exc.strerror or exc})")
    return report


def _restore(entry: dict[str, object], path: str, backups: Path) -> None:
    was = entry["was"]
    backup = backups / str(entry.get("backup", ""))
    if was in ("file", "dir") and not os.path.lexists(backup):
        # the backup went missing (the job removed peakmem's directory): keep what is there
        raise FileNotFoundError(2, "its backup is gone", str(backup))
    _remove(path)
    if was == "absent":
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if was == "link":
        os.symlink(str(entry["target"]), path)
        return
    try:
        os.rename(backup, path)  # the same file system: the very file (or tree) back
    except OSError:
        if was == "dir":
            shutil.copytree(backup, path, symlinks=True)
        else:
            shutil.copy2(backup, path, follow_symlinks=False)


def _remove(path: str) -> None:
    """Remove whatever is at `path` now, never following a symlink."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)

