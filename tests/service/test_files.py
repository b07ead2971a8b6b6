"""Safe handling of the files a request sends: names, caps, archives."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peakmem.service.files import (
    FileLimits,
    FilesError,
    check_files,
    check_path,
    extract_archive,
    write_files,
)


@pytest.mark.parametrize("name, expected", [
    ("train.py", "train.py"), ("./a/b.py", "a/b.py"), ("a//b.py", "a/b.py"), ("a/./b", "a/b"),
])
def test_good_names_are_normalised(name, expected):
    assert check_path(name) == expected


@pytest.mark.parametrize("name", [
    "", "/etc/passwd", "../x", "a/../../x", "a/..", "~/x", "a\\..\\x", "a\x00b", "a\nb", ".", "./",
    "x" * 600, "/".join(["d"] * 40),
])
def test_bad_names_are_refused(name):
    with pytest.raises(FilesError):
        check_path(name)


@given(st.text(min_size=1, max_size=60))
def test_no_name_escapes_the_work_directory(name):
    try:
        checked = check_path(name)
    except FilesError:
        return
    root = Path("/work/root")
    target = (root / checked).resolve()
    assert root in target.parents


def test_caps_duplicates_and_file_directory_clashes():
    limits = FileLimits(max_files=2, max_file_bytes=10, max_total_bytes=15)
    with pytest.raises(FilesError, match="too many"):
        check_files({"a": b"", "b": b"", "c": b""}, limits)
    with pytest.raises(FilesError, match="larger than 10"):
        check_files({"a": b"x" * 11}, limits)
    with pytest.raises(FilesError, match="in all"):
        check_files({"a": b"x" * 10, "b": b"x" * 10}, limits)
    with pytest.raises(FilesError, match="twice"):
        check_files({"a/b": b"", "./a/b": b""})
    with pytest.raises(FilesError, match="both a file and a directory"):
        check_files({"a": b"", "a/b/c": b""})


def _tar(add) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        add(archive)
    return buffer.getvalue()


def _file(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def _special(name: str, kind: bytes, target: str = ""):
    def add(archive):
        info = tarfile.TarInfo(name)
        info.type = kind
        info.linkname = target
        archive.addfile(info)
    return add


def test_tar_regular_files_and_directories():
    def add(archive):
        info = tarfile.TarInfo("pkg")
        info.type = tarfile.DIRTYPE
        archive.addfile(info)
        _file(archive, "pkg/train.py", b"print(1)")
        _file(archive, "README", b"hi")

    assert extract_archive(_tar(add)) == {"README": b"hi", "pkg/train.py": b"print(1)"}


@pytest.mark.parametrize("add", [
    _special("link", tarfile.SYMTYPE, "/etc/passwd"),
    _special("hard", tarfile.LNKTYPE, "/etc/passwd"),
    _special("dev", tarfile.CHRTYPE),
    _special("fifo", tarfile.FIFOTYPE),
    lambda archive: _file(archive, "../escape.py", b"x"),
    lambda archive: _file(archive, "/abs.py", b"x"),
])
def test_tar_links_specials_and_escapes_are_refused(add):
    with pytest.raises(FilesError):
        extract_archive(_tar(add))


def test_tar_past_the_caps_is_refused_on_bytes_read():
    limits = FileLimits(max_file_bytes=1000, max_total_bytes=1500)
    with pytest.raises(FilesError):
        extract_archive(_tar(lambda a: _file(a, "big", b"\0" * 5000)), limits)
    with pytest.raises(FilesError):
        extract_archive(_tar(lambda a: (_file(a, "a", b"\0" * 900), _file(a, "b", b"\0" * 900))),
                        limits)


def _zip(entries) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for info, data in entries:
            archive.writestr(info, data)
    return buffer.getvalue()


def test_zip_files_and_refusals():
    assert extract_archive(_zip([("a/train.py", b"x=1")])) == {"a/train.py": b"x=1"}
    with pytest.raises(FilesError):
        extract_archive(_zip([("../../x", b"1")]))
    link = zipfile.ZipInfo("link")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with pytest.raises(FilesError, match="link"):
        extract_archive(_zip([(link, "/etc/passwd")]))
    bomb = _zip([("bomb", b"\0" * 200_000)])
    assert len(bomb) < 2000
    with pytest.raises(FilesError):
        extract_archive(bomb, FileLimits(max_file_bytes=100_000, max_total_bytes=100_000))


def test_not_an_archive():
    with pytest.raises(FilesError):
        extract_archive(b"definitely not an archive")


def test_write_files(tmp_path):
    write_files({"a/b.py": b"x", "c": b"y"}, tmp_path)
    assert (tmp_path / "a" / "b.py").read_bytes() == b"x" and (tmp_path / "c").read_bytes() == b"y"
