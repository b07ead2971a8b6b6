"""A job's files as the service receives them: checked relative paths, size caps, safe archive
extraction (tar or zip: no absolute paths, no `..`, no links or devices, bounded sizes), and
writing them into a fresh work directory."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


class FilesError(ValueError):
    """The job's files are malformed or hostile (the contract's `bad_input`)."""


@dataclass(frozen=True)
class FileLimits:
    max_files: int = 2000
    max_file_bytes: int = 16 * 2**20
    max_total_bytes: int = 64 * 2**20
    max_path_chars: int = 512
    max_depth: int = 32


DEFAULT_LIMITS = FileLimits()


def check_path(name: str, limits: FileLimits = DEFAULT_LIMITS) -> str:
    """`name` as a normalised relative POSIX path; FilesError for an absolute path, `..`, a
    backslash, a control character, an empty or over-long name."""
    if not isinstance(name, str) or not name or len(name) > limits.max_path_chars:
        raise FilesError(f"bad file name {name!r:.80}: empty or longer than {limits.max_path_chars}")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name) or "\\" in name:
        raise FilesError(f"bad file name {name!r:.80}: control character or backslash")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in name):  # no file system can name it
        raise FilesError(f"bad file name {name!r:.80}: not valid Unicode (a lone surrogate)")
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("~"):
        raise FilesError(f"bad file name {name!r:.80}: absolute paths are refused")
    parts = [part for part in path.parts if part != "."]
    if not parts or ".." in parts:
        raise FilesError(f"bad file name {name!r:.80}: '..' and empty paths are refused")
    if len(parts) > limits.max_depth:
        raise FilesError(f"bad file name {name!r:.80}: deeper than {limits.max_depth}")
    return "/".join(parts)


def check_files(files: dict[str, bytes], limits: FileLimits = DEFAULT_LIMITS) -> dict[str, bytes]:
    """The files with checked names; FilesError on a bad name, a duplicate after normalising, a
    file that is also a directory, or past the caps."""
    if len(files) > limits.max_files:
        raise FilesError(f"too many files ({len(files)} > {limits.max_files})")
    checked: dict[str, bytes] = {}
    total = 0
    for name, data in files.items():
        path = check_path(name, limits)
        if path in checked:
            raise FilesError(f"file {path!r} given twice")
        if len(data) > limits.max_file_bytes:
            raise FilesError(f"file {path!r} is larger than {limits.max_file_bytes} bytes")
        total += len(data)
        if total > limits.max_total_bytes:
            raise FilesError(f"the files are larger than {limits.max_total_bytes} bytes in all")
        checked[path] = data
    directories = {str(parent) for path in checked for parent in PurePosixPath(path).parents}
    clash = sorted(directories & set(checked))
    if clash:
        raise FilesError(f"{clash[0]!r} is both a file and a directory")
    return dict(sorted(checked.items()))


def extract_archive(data: bytes, limits: FileLimits = DEFAULT_LIMITS) -> dict[str, bytes]:
    """The regular files of a tar (plain, gz, bz2, xz) or zip archive held in memory.

    Directories are implied; links, devices and FIFOs are refused (FilesError), as are names
    `check_path` refuses and archives past the caps (checked on the bytes read, not the sizes
    the archive claims)."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        return check_files(_unzip(data, limits), limits)
    tar = _decompressed(data, _tar_bytes_cap(limits))
    try:
        archive = tarfile.open(fileobj=io.BytesIO(tar), mode="r:")  # noqa: SIM115
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise FilesError(f"not a tar or zip archive ({exc})") from None
    try:
        return check_files(_untar(archive, limits), limits)
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        if isinstance(exc, FilesError):
            raise
        raise FilesError(f"broken archive ({exc})") from None
    finally:
        archive.close()


_DECOMPRESSORS: dict[bytes, Callable[[io.BytesIO], io.BufferedIOBase]] = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": lambda raw: bz2.BZ2File(raw, mode="rb"),
    b"\xfd7zXZ\x00": lambda raw: lzma.LZMAFile(raw, mode="rb"),  # noqa: SIM115
}
"""Compressed tar formats by their magic bytes (what tarfile's "r:*" tries), each opened as a
stream that decompresses on demand."""


def _tar_bytes_cap(limits: FileLimits) -> int:
    """The most bytes a tar within `limits` can take once decompressed: the files' bytes, and
    for each member a header, a long-name or pax header and the padding to 512-byte blocks, and
    the end-of-archive blocks."""
    per_member = 4 * 512 + 2 * limits.max_path_chars
    return limits.max_total_bytes + limits.max_files * 2 * per_member + 20 * 512


def _decompressed(data: bytes, cap: int) -> bytes:
    """`data` decompressed (gzip, bzip2, xz) or as it is; FilesError where it would take more
    than `cap` bytes. tarfile reads a member's long-name or pax header whole, whatever size it
    claims: a 100 KB .tar.gz of one 100 MB name took 100 MB (and a 96 MB upload, ~96 GB)."""
    opener = next((found for magic, found in _DECOMPRESSORS.items() if data.startswith(magic)),
                  None)
    if opener is None:
        return data
    try:
        with opener(io.BytesIO(data)) as stream:
            tar = stream.read(cap + 1)
    except (OSError, EOFError, ValueError, lzma.LZMAError) as exc:
        raise FilesError(f"not a tar or zip archive (broken compressed data: {exc})") from None
    if len(tar) > cap:
        raise FilesError(f"the archive decompresses to more than {cap} bytes (more than "
                         "files within the caps take)")
    return tar


def _read_capped(stream: io.BufferedIOBase, name: str, budget: int, limits: FileLimits) -> bytes:
    cap = min(limits.max_file_bytes, budget)
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise FilesError(f"file {name!r} makes the archive larger than the caps")
    return data


def _untar(archive: tarfile.TarFile, limits: FileLimits) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    for count, member in enumerate(archive, start=1):
        if count > limits.max_files * 2:
            raise FilesError(f"too many archive members (> {limits.max_files * 2})")
        if member.isdir():
            check_path(member.name, limits)
            continue
        if not member.isfile():
            raise FilesError(f"archive member {member.name!r:.80} is a link or a special file")
        name = check_path(member.name, limits)
        stream = archive.extractfile(member)
        if stream is None:
            raise FilesError(f"archive member {member.name!r:.80} cannot be read")
        data = _read_capped(stream, name, limits.max_total_bytes - total, limits)
        total += len(data)
        if name in files:
            raise FilesError(f"file {name!r} given twice")
        files[name] = data
    return files


def _unzip(data: bytes, limits: FileLimits) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise FilesError(f"broken zip archive ({exc})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.max_files * 2:
            raise FilesError(f"too many archive members (> {limits.max_files * 2})")
        for info in infos:
            mode = (info.external_attr >> 16) & 0o170000
            if info.is_dir():
                check_path(info.filename, limits)
                continue
            if mode not in (0, 0o100000):  # a symlink (0o120000), device, FIFO...
                raise FilesError(f"archive member {info.filename!r:.80} is a link or a special file")
            name = check_path(info.filename, limits)
            try:
                with archive.open(info) as stream:
                    content = _read_capped(stream, name, limits.max_total_bytes - total, limits)
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, RuntimeError) as exc:
                raise FilesError(f"archive member {name!r} cannot be read ({exc})") from None
            total += len(content)
            if name in files:
                raise FilesError(f"file {name!r} given twice")
            files[name] = content
    return files


def write_files(files: dict[str, bytes], root: Path) -> None:
    """Write checked files under `root` (an empty directory peakmem made)."""
    root = root.resolve()
    for name, data in files.items():
        target = root.joinpath(*PurePosixPath(check_path(name)).parts)
        if root not in target.parents:  # cannot happen after check_path; kept as a guard
            raise FilesError(f"file {name!r} would be written outside the work directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
