"""The job's side of "an estimate leaves the user's files as they were": journal every path the
job is about to change, before it changes it.

peakmem runs the user's unmodified script, so everything it writes (logs, checkpoints, a Hugging
Face Trainer's output directory, TensorBoard event files) would land in the real filesystem, and
whatever it deletes (``save_total_limit`` rotation, ``shutil.rmtree(out_dir)``) would be gone. In
the job's process an audit hook (:func:`sys.addaudithook`, the events in :data:`WATCHED`) runs
before each file operation and appends one JSON line per path to a journal in a directory owned
by peakmem's process (the parent), so that the parent puts everything back
(:mod:`peakmem.jobs.file_rollback`) whatever way the job ends (``os._exit``, timeout, a signal):

- a path that did not exist is journaled ``absent`` (the parent removes what is there at the end);
- a path that existed is backed up into the journal directory first, then journaled with its
  backup: a file the job is about to write in place, truncate, chmod or rename is copied (its
  data may change under the new name); one it is about to remove, replace or open with ``"w"``
  is hard-linked when the backup directory is on its file system (no bytes copied; ``"w"`` then
  gets a new file of that name), else copied; a directory it is about to remove is backed up as
  a tree of hard links the same way, one it renames as a copied tree. Backups are made only
  when needed, once per path (a path under one already journaled is covered by it).

When a backup cannot be made (over :data:`BACKUP_LIMIT_ENV` bytes, a full disk, an unreadable
file) the operation is blocked: the hook raises PermissionError naming the path, and the journal
records it so the estimate says so. Paths peakmem leaves alone (:func:`exempt_roots`): the system
temp directory, caches the job's libraries fill (``~/.cache``, ``$HF_HOME``, ``$TORCH_HOME``,
Triton's and Inductor's), the runtime directory, ``/dev``, ``/proc``, ``/sys``, ``__pycache__``
directories and peakmem's own directories. What a process the job starts with a new interpreter
(``subprocess``) writes is not journaled, except in the Python processes peakmem captures
(capture.python_subprocesses), which install this journal too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

JOURNAL_NAME = "journal.jsonl"
BACKUPS_NAME = "backups"
BACKUP_LIMIT_ENV = "PEAKMEM_JOB_FILES_BACKUP_LIMIT"
DEFAULT_BACKUP_LIMIT = 4 << 30
"""Bytes one job process may copy to back files up (hard links cost nothing); past it, the
operation that needed the copy is blocked."""
FREE_SPACE_MARGIN = 256 << 20

WRITE, REMOVE, MOVE = "write", "remove", "move"
"""What an operation is about to do to a path: change it in place (a copy backs it up), remove
or replace it (a hard link does), rename it (a copy: the data may change under its new name)."""

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

# env variables naming cache directories a job's libraries fill; (variable, default under ~)
CACHE_DIRS: tuple[tuple[str, str | None], ...] = (
    ("XDG_CACHE_HOME", "~/.cache"),
    ("HF_HOME", None),
    ("HF_HUB_CACHE", None),
    ("HF_DATASETS_CACHE", None),
    ("TRANSFORMERS_CACHE", None),
    ("TORCH_HOME", None),
    ("TRITON_CACHE_DIR", "~/.triton"),
    ("TORCHINDUCTOR_CACHE_DIR", None),
    ("XDG_RUNTIME_DIR", None),
    ("PEAKMEM_RUNTIME_DIR", None),
    ("MPLCONFIGDIR", "~/.config/matplotlib"),
)
SYSTEM_ROOTS = ("/dev", "/proc", "/sys")


def exempt_roots(extra: Iterable[str | os.PathLike[str]] = ()) -> tuple[str, ...]:
    """Directories whose contents the journal leaves alone (absolute, symlinks resolved)."""
    roots = {tempfile.gettempdir(), *SYSTEM_ROOTS, *map(os.fspath, extra)}
    for name, default in CACHE_DIRS:
        value = os.environ.get(name) or (os.path.expanduser(default) if default else None)
        if value:
            roots.add(value)
    resolved = set()
    for root in roots:
        resolved.add(os.path.abspath(root))
        resolved.add(os.path.realpath(root))
    return tuple(sorted(resolved))


class BlockedOperation(PermissionError):
    """A destructive file operation the journal could not back up first."""


def _path_of(value: object, dir_fd: object = None) -> str | None:
    """The absolute path an audit event names (None for file descriptors and odd values)."""
    if isinstance(value, int) or value is None:
        return None
    try:
        text = os.fsdecode(os.fspath(value))  # type: ignore[arg-type]
    except TypeError:
        return None
    if not os.path.isabs(text) and isinstance(dir_fd, int) and dir_fd >= 0:
        try:
            text = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), text)
        except OSError:
            return None
    return os.path.abspath(text)


@dataclass
class FileJournal:
    """Journals and backs up, in one job process, each path before the job changes it."""

    directory: Path
    exempt: tuple[str, ...]
    limit: int = DEFAULT_BACKUP_LIMIT
    copied: int = 0
    made: int = 0
    """Backups made by this process (the newest is named PID-made)."""
    covered: set[str] = field(default_factory=set)
    """Paths journaled (their subtrees too when journaled absent or as a tree) by this process."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)
    _fd: int = -1

    def __post_init__(self) -> None:
        self.backups = self.directory / BACKUPS_NAME
        self.backups.mkdir(parents=True, exist_ok=True)
        self._open()
        self._device = os.stat(self.backups).st_dev
        os.register_at_fork(after_in_child=self._after_fork)

    def _open(self) -> None:
        self._fd = os.open(self.directory / JOURNAL_NAME,
                           os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        self._local = threading.local()

    # -- the audit hook ------------------------------------------------------------------------

    def hook(self, event: str, args: tuple) -> None:
        handler = _HANDLERS.get(event)
        if handler is None or getattr(self._local, "busy", False):
            return
        self._local.busy = True
        try:
            with self._lock:
                handler(self, args)
        except BlockedOperation:
            raise
        except Exception as exc:  # noqa: BLE001 - the journal's own failure
            if event in DESTRUCTIVE:  # what it would remove could not be put back: refuse
                raise BlockedOperation(
                    f"peakmem blocked the job's {event} {args[:2]!r}: its file journal failed "
                    f"({type(exc).__name__}: {exc})") from None
            # a write that was not journaled is left behind at worst: the job's I/O goes on
        finally:
            self._local.busy = False

    # -- what an operation does to a path --------------------------------------------------------

    def written(self, path: str | None) -> None:
        """`path` is about to be created or changed in place (a symlink: its target is)."""
        if path is None:
            return
        if os.path.islink(path):
            path = os.path.realpath(path)
        self._journal(path, WRITE)

    def replaced(self, path: str | None) -> None:
        """`path` (not its symlink's target) is about to be removed or replaced."""
        if path is not None:
            self._journal(path, REMOVE)

    def moved(self, path: str | None) -> None:
        """`path` is about to be renamed: its data lives on, and may change, under a new name."""
        if path is not None and not os.path.islink(path):
            self._journal(path, MOVE)

    def _skipped(self, path: str) -> bool:
        if "__pycache__" in path.split(os.sep):
            return True
        probe = path
        while True:
            if probe in self.covered:
                return True
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep)
                   for root in self.exempt)

    def _journal(self, path: str, how: str) -> None:
        # through its real directory: a write through a symlinked directory lands over there
        path = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if self._skipped(path):
            return
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            self._write({"path": path, "was": "absent"})
            self.covered.add(path)
            return
        except OSError:
            return
        entry: dict[str, object] = {"path": path}
        if stat.S_ISLNK(info.st_mode):
            entry.update(was="link", target=os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            if how == WRITE:  # chmod / utime of a directory: its contents are not touched
                return
            entry.update(was="dir", backup=self._backup_tree(path, linked=how == REMOVE))
        elif stat.S_ISREG(info.st_mode):
            entry.update(was="file", backup=self._backup_file(path, info, linked=how == REMOVE))
        else:
            return  # fifos, sockets, devices: nothing to keep
        self._write(entry)
        self.covered.add(path)

    # -- backups -------------------------------------------------------------------------------

    def _new_backup(self) -> Path:
        self.made += 1
        return self.backups / f"{os.getpid()}-{self.made}"

    def _block(self, path: str, why: str) -> None:
        message = (f"peakmem blocked the job from changing {path}, which existed before the "
                   f"estimate: {why}, so it could not be put back afterwards")
        self._write({"path": path, "blocked": why})
        raise BlockedOperation(message)

    def _room_for(self, path: str, size: int) -> None:
        if self.copied + size > self.limit:
            self._block(path, f"backing it up would copy {size} bytes, over the limit of "
                              f"{self.limit} bytes ({BACKUP_LIMIT_ENV})")
        if shutil.disk_usage(self.backups).free - size < FREE_SPACE_MARGIN:
            self._block(path, f"no room to back up its {size} bytes in {self.backups}")

    def _backup_file(self, path: str, info: os.stat_result, linked: bool) -> str:
        backup = self._new_backup()
        if linked and info.st_dev == self._device:
            try:
                os.link(path, backup)
                return backup.name
            except OSError:
                pass
        self._room_for(path, info.st_size)
        try:
            shutil.copy2(path, backup, follow_symlinks=False)
        except OSError as exc:
            self._block(path, f"it could not be backed up ({exc.strerror or exc})")
        self.copied += info.st_size
        return backup.name

    def _backup_tree(self, path: str, linked: bool) -> str:
        backup = self._new_backup()
        linked = linked and os.lstat(path).st_dev == self._device
        if not linked:
            self._room_for(path, _tree_size(path))
        copy = _link_or_copy if linked else shutil.copy2
        try:
            shutil.copytree(path, backup, symlinks=True, copy_function=copy)
        except (OSError, shutil.Error) as exc:
            shutil.rmtree(backup, ignore_errors=True)
            self._block(path, f"it could not be backed up ({exc})")
        if not linked:
            self.copied += _tree_size(str(backup))
        return backup.name

    def _write(self, entry: dict[str, object]) -> None:
        line = (json.dumps(entry, ensure_ascii=True) + "\n").encode()
        try:
            os.write(self._fd, line)
        except OSError:  # the job closed every descriptor: open the journal again
            self._open()
            os.write(self._fd, line)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination, follow_symlinks=False)
    except OSError:
        shutil.copy2(source, destination, follow_symlinks=False)


def _tree_size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


# -- audit events -> what they do to which paths -----------------------------------------------


def _open(journal: FileJournal, args: tuple) -> None:
    path, mode, flags = (args + (None, None, None))[:3]
    writing = (isinstance(flags, int) and flags & _WRITE_FLAGS
               or isinstance(mode, str) and any(c in mode for c in "wax+"))
    if not writing:
        return
    target = _path_of(path)
    if target is None:
        return
    fresh = isinstance(flags, int) and flags & os.O_TRUNC and flags & os.O_CREAT
    if fresh and not os.path.islink(target):
        # its old content is lost anyway: a hard link keeps the old file, and the job's open
        # makes a new one under the same name
        journal.replaced(target)
        if _is_newest_backup(journal, target):
            os.unlink(target)
        return
    journal.written(target)


def _is_newest_backup(journal: FileJournal, path: str) -> bool:
    """Whether `path`'s file is the one (hard-linked) backup this process just made."""
    try:
        newest = journal.backups / f"{os.getpid()}-{journal.made}"
        return os.path.samestat(os.stat(path), os.stat(newest))
    except OSError:
        return False


def _mkdir(journal: FileJournal, args: tuple) -> None:
    journal.written(_path_of(args[0], args[2] if len(args) > 2 else None))


def _remove(journal: FileJournal, args: tuple) -> None:
    journal.replaced(_path_of(args[0], args[1] if len(args) > 1 else None))


def _rename(journal: FileJournal, args: tuple) -> None:
    source = _path_of(args[0], args[2] if len(args) > 2 else None)
    destination = _path_of(args[1], args[3] if len(args) > 3 else None)
    journal.moved(source)
    journal.replaced(destination)


def _move(journal: FileJournal, args: tuple) -> None:
    source, destination = _path_of(args[0]), _path_of(args[1])
    if source is not None and destination is not None and os.path.isdir(destination):
        destination = os.path.join(destination, os.path.basename(source.rstrip(os.sep)))
    _rename(journal, (source, destination))


def _rmtree(journal: FileJournal, args: tuple) -> None:
    journal.replaced(_path_of(args[0], args[1] if len(args) > 1 else None))


def _link(journal: FileJournal, args: tuple) -> None:
    source = _path_of(args[0], args[2] if len(args) > 2 else None)
    if source is not None:  # the new name shares the file: a write through it changes this one
        journal.written(source)
    journal.replaced(_path_of(args[1], args[3] if len(args) > 3 else None))


def _symlink(journal: FileJournal, args: tuple) -> None:
    journal.replaced(_path_of(args[1], args[2] if len(args) > 2 else None))


def _in_place(journal: FileJournal, args: tuple) -> None:
    journal.written(_path_of(args[0], args[-1] if len(args) > 2 else None))


def _truncate(journal: FileJournal, args: tuple) -> None:
    journal.written(_path_of(args[0]))


_HANDLERS: dict[str, Callable[[FileJournal, tuple], None]] = {
    "open": _open,
    "os.mkdir": _mkdir,
    "os.remove": _remove,
    "os.rmdir": _remove,
    "os.rename": _rename,
    "shutil.move": _move,
    "shutil.rmtree": _rmtree,
    "os.link": _link,
    "os.symlink": _symlink,
    "os.truncate": _truncate,
    "os.chmod": _in_place,
    "os.chown": _in_place,
    "os.utime": _in_place,
}
DESTRUCTIVE = frozenset({"os.remove", "os.rmdir", "os.rename", "shutil.move", "shutil.rmtree",
                         "os.truncate"})
"""Events that destroy what existed: refused when the journal fails on them."""
WATCHED = frozenset(_HANDLERS)
"""The audit events (https://docs.python.org/3/library/audit_events.html) that change files."""


_ACTIVE: list[FileJournal] = []


def before_native_write(path: str | bytes | os.PathLike[str]) -> None:
    """A writer that does not go through Python's ``open`` (torch.save's C++ writer,
    safetensors') is about to create or overwrite `path`: journal it as such an ``open``."""
    for journal in _ACTIVE:
        journal.hook("open", (path, "wb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC))


def install(directory: str | os.PathLike[str], exempt: Iterable[str | os.PathLike[str]] = ()
            ) -> FileJournal:
    """Journal this process's file changes into `directory` from now on (for good: an audit hook
    cannot be removed)."""
    try:
        limit = int(os.environ.get(BACKUP_LIMIT_ENV, DEFAULT_BACKUP_LIMIT))
    except ValueError:
        limit = DEFAULT_BACKUP_LIMIT
    journal = FileJournal(Path(directory), exempt_roots([directory, *exempt]), limit)
    watched, handle = WATCHED, journal.hook

    def hook(event: str, args: tuple) -> None:  # on every audit event (builtins.id too): lean
        if event in watched:
            handle(event, args)

    sys.addaudithook(hook)
    _ACTIVE[:] = [journal]
    return journal
