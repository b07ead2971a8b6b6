"""The job process's file journal (jobs.file_journal) and its rollback (jobs.file_rollback),
driven in a plain child interpreter: no capture, so each case takes a fraction of a second."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from peakmem.jobs.file_journal import BACKUP_LIMIT_ENV
from peakmem.jobs.file_rollback import read_journal, roll_back
from tests.jobs.job_files_tree import CHANGES, snapshot, user_tree

SRC = Path(__file__).resolve().parents[2] / "src"

ENDINGS = {
    "returns": "",
    "os_exit": "os._exit(0)",
    "killed": "import signal; os.kill(os.getpid(), signal.SIGKILL)",
}


def run_journaled(work: Path, journal: Path, code: str, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter in `work`, its file changes journaled into `journal`."""
    journal.mkdir(exist_ok=True)
    temp = journal.parent / "systemp"  # the tree is under /tmp: another temp dir for the job
    temp.mkdir(exist_ok=True)
    boot = ("import sys; from peakmem.jobs.file_journal import install; "
            f"install({str(journal)!r}); exec(compile(sys.argv[1], 'job', 'exec'))")
    environ = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(temp), **(env or {})}
    return subprocess.run([sys.executable, "-c", boot, code], cwd=work, env=environ,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_every_change_is_put_back_however_the_process_ends(tmp_path, ending):
    work = user_tree(tmp_path)
    before = snapshot(work)
    done = run_journaled(work, tmp_path / "journal", CHANGES + ENDINGS[ending])
    assert done.returncode == (-9 if ending == "killed" else 0), done.stderr
    assert snapshot(work) != before  # the job did change the tree
    report = roll_back(tmp_path / "journal")
    assert snapshot(work) == before
    assert not report.failed and not report.blocked
    assert report.paths >= 10
    assert "put them back" in report.notes()[0]


def test_a_removed_file_returns_as_the_same_file(tmp_path):
    """A removed file is kept by a hard link, not a copy: the very file (inode) comes back."""
    work = user_tree(tmp_path)
    inode = (work / "data" / "big.bin").stat().st_ino
    run_journaled(work, tmp_path / "journal", "import os; os.remove('data/big.bin')")
    roll_back(tmp_path / "journal")
    assert (work / "data" / "big.bin").stat().st_ino == inode


def test_a_change_that_cannot_be_backed_up_is_blocked(tmp_path):
    work = user_tree(tmp_path)
    before = snapshot(work)
    code = ("try:\n    open('data/big.bin', 'ab').write(b'x')\n"
            "except PermissionError as exc:\n    print('BLOCKED', exc)\n")
    done = run_journaled(work, tmp_path / "journal", code, env={BACKUP_LIMIT_ENV: "1000"})
    assert "BLOCKED peakmem blocked the job from changing" in done.stdout, done.stderr
    assert snapshot(work) == before  # the append never ran
    report = roll_back(tmp_path / "journal")
    assert snapshot(work) == before
    assert report.blocked and "over the limit of 1000 bytes" in report.notes()[-1]


def test_temp_and_cache_directories_are_left_alone(tmp_path):
    work = user_tree(tmp_path)
    temp, cache = tmp_path / "systemp", tmp_path / "cache"
    code = ("import tempfile, os\n"
            "open(os.path.join(tempfile.gettempdir(), 'scratch.txt'), 'w').write('t')\n"
            "os.makedirs(os.path.join(os.environ['XDG_CACHE_HOME'], 'hub'))\n"
            "os.makedirs('pkg/__pycache__')\nopen('pkg/__pycache__/m.pyc', 'wb').write(b'')\n")
    run_journaled(work, tmp_path / "journal", code, env={"XDG_CACHE_HOME": str(cache)})
    assert [entry["path"] for entry in read_journal(tmp_path / "journal")] == [str(work / "pkg")]
    roll_back(tmp_path / "journal")
    assert (temp / "scratch.txt").read_text() == "t" and (cache / "hub").is_dir()
    assert not (work / "pkg").exists()


def test_a_write_through_a_symlinked_directory_is_put_back_over_there(tmp_path):
    """The job links to a directory outside its tree and removes and writes through the link:
    the removed file comes back and the new one goes, and the link (the job's) is removed."""
    work = user_tree(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.txt").write_text("keep me")
    before = snapshot(tmp_path)
    code = (f"import os; os.symlink({str(elsewhere)!r}, 'link')\n"
            "os.remove('link/precious.txt'); open('link/new.txt', 'w').write('n')\n")
    run_journaled(work, tmp_path / "journal", code)
    assert not (elsewhere / "precious.txt").exists()
    roll_back(tmp_path / "journal")
    assert _without(snapshot(tmp_path)) == _without(before)


def _without(state: dict[str, tuple]) -> dict[str, tuple]:
    """`state` without the test's own directories (the journal, the job's temp directory)."""
    return {path: what for path, what in state.items()
            if path.split(os.sep)[0] not in ("journal", "systemp")}


def test_a_cut_short_journal_line_is_skipped(tmp_path):
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "journal.jsonl").write_text(
        f'{{"path": "{tmp_path}/made", "was": "absent"}}\n{{"path": "/etc/pass')
    (tmp_path / "made").write_text("x")
    report = roll_back(journal)
    assert not (tmp_path / "made").exists() and report.paths == 1


@pytest.mark.parametrize("entry", [
    '{"path": "relative/path", "was": "absent"}',
    '{"path": "/x", "was": "file", "backup": "../../etc/passwd"}',
    '{"path": "/x", "was": "dir", "backup": ".."}',
    '{"path": "/x", "was": "link"}',
    '["/x"]',
])
def test_malformed_entries_are_ignored(tmp_path, entry):
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "journal.jsonl").write_text(entry + "\n")
    assert read_journal(journal) == []


def test_a_path_whose_backup_is_gone_is_left_as_the_job_left_it(tmp_path):
    work = user_tree(tmp_path)
    run_journaled(work, tmp_path / "journal", "open('config.json', 'a').write('!')")
    for backup in (tmp_path / "journal" / "backups").iterdir():
        backup.unlink()
    report = roll_back(tmp_path / "journal")
    assert (work / "config.json").read_text() == '{"lr": 0.1}!'
    assert "could not put back 1 path(s)" in report.notes()[-1]


def test_a_removal_the_journal_fails_on_is_refused(tmp_path):
    """A bug in the journal must not turn into a silent loss: the removal is refused instead."""
    work = user_tree(tmp_path)
    before = snapshot(work)
    code = ("from peakmem.jobs.file_journal import FileJournal\n"
            "def broken(*args, **kwargs): raise RuntimeError('disk on fire')\n"
            "FileJournal._backup_tree = broken\n"
            "import shutil\ntry:\n    shutil.rmtree('data')\n"
            "except PermissionError as exc:\n    print('REFUSED', exc)\n")
    done = run_journaled(work, tmp_path / "journal", code)
    assert "REFUSED peakmem blocked the job's shutil.rmtree" in done.stdout, done.stderr
    assert "disk on fire" in done.stdout
    assert snapshot(work) == before
