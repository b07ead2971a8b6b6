from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.datasets.loaders import default_data_dir

FIXTURE_DATA = Path(__file__).resolve().parent / "data" / "datasets"


@pytest.fixture
def fixture_data() -> Path:
    """A tiny hand-made data directory (tests/data/datasets), shaped like the shared one."""
    return FIXTURE_DATA


@pytest.fixture
def shared_data() -> Path:
    """The real ../shared/datasets; tests using it skip when it is absent."""
    path = default_data_dir()
    if path is None or not (path / "gpumemnet").is_dir():
        pytest.skip("../shared/datasets is not present")
    return path


@pytest.fixture
def a100():
    from peakmem.profiles import load_gpu

    return load_gpu("a100-40gb")


@pytest.fixture
def stack24():
    from peakmem.profiles import load_stack

    return load_stack("2.4.1")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tests.parallel import group_shared_fixture_users, slow_first

    group_shared_fixture_users(items)
    slow_first(items)
