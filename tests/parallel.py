"""The suite runs in parallel (`pytest -n auto --dist loadgroup`, README): tests that share a
fixture wider than one test (module, class or package scope: one capture asserted on by several
tests) go to one worker together, so that the shared work is done once.

Every test module gets this without listing it anywhere: :func:`group_shared_fixture_users`
marks each test that uses such a fixture with ``xdist_group`` named after its module; the others
stay separate and are balanced one by one."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

SHARED_SCOPES = frozenset({"class", "module", "package"})
"""Scopes whose fixture value several tests of one module reuse (session fixtures are made once
per worker; a module's tests on two workers would each make its module fixtures)."""


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The names of the fixtures `item` uses, directly or through other fixtures, that are
    computed once for several tests of its module."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return sorted(name for name, definitions in info.name2fixturedefs.items()
                  if definitions and definitions[-1].scope in SHARED_SCOPES)


def module_group(item: pytest.Item) -> str:
    """The group name of `item`'s module: its file's node id (`tests/jobs/test_x.py`)."""
    return item.nodeid.split("::", 1)[0]


def group_shared_fixture_users(items: Iterable[pytest.Item]) -> int:
    """Mark the tests that use a shared fixture with their module's ``xdist_group`` (unless
    they carry one); how many were marked."""
    marked = 0
    for item in items:
        if item.get_closest_marker("xdist_group") is None and shared_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(module_group(item)))
            marked += 1
    return marked


SLOW_MODULES = (
    "tests/library_jobs/",  # each test a `peakmem estimate` subprocess of a library script
    "tests/capture/test_compile_capture2.py",
    "tests/cli/test_estimate_process.py",
    "tests/estimate/test_fit_search.py",
)
"""Where the tests that take tens of seconds each live (docs/DEVELOPMENT.md, "The test suite's
time"); tests marked ``slow`` count too."""


def is_slow(item: pytest.Item) -> bool:
    return (module_group(item).startswith(SLOW_MODULES)
            or item.get_closest_marker("slow") is not None)


def slow_first(items: list[pytest.Item]) -> None:
    """Put the slow tests first, each part in its collection order. xdist hands out work in
    that order (a group's tests as one unit, the groups with the most tests first): a slow test
    handed out last would keep one worker busy after the other has finished, a fast one evens
    the two workers out."""
    items[:] = [item for item in items if is_slow(item)] + [
        item for item in items if not is_slow(item)]
