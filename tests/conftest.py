from __future__ import annotations

from pathlib import Path

import pytest

from peakmem.datasets.loaders import default_data_dir

FIXTURE_DATA = Path(__file__).resolve().parent / "data" / "datasets"

GUARDED_ENVIRONMENT = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG")
"""Variables an in-process job may set that change every later estimate in the same xdist
worker (one test's job leaving PYTORCH_CUDA_ALLOC_CONF set failed 9 unrelated tests in a CI run)."""


@pytest.fixture(autouse=True)
def environment_not_leaked(request):
    """Each test leaves GUARDED_ENVIRONMENT as it found it: put back after it (torn down after
    monkeypatch's own undo), with a warning naming the test and the variable (in-process jobs
    that set them legitimately, Lightning's `deterministic=True` among them, are not errors)."""
    import os

    before = {name: os.environ.get(name) for name in GUARDED_ENVIRONMENT}
    yield
    leaked = {name: os.environ.get(name) for name in GUARDED_ENVIRONMENT
              if os.environ.get(name) != before[name]}
    for name in leaked:
        if before[name] is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before[name]
    if leaked:
        import warnings

        warnings.warn(f"{request.node.nodeid} left the environment changed (put back): {leaked}",
                      stacklevel=1)


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After a module's last test and its fixtures' teardown: freeze what is alive
    (tests/gc_freeze.py), so that later full collections do not walk the libraries imported
    so far."""
    yield
    from tests.gc_freeze import freeze_what_is_alive, module_ends

    if module_ends(item, nextitem):
        freeze_what_is_alive()
