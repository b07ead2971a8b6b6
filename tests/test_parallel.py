"""tests/parallel.py: the tests that share a module's fixture are grouped onto one xdist worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.parallel import group_shared_fixture_users, is_slow, shared_fixtures, slow_first

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[1]

MODULE = """
import pytest

@pytest.fixture(scope="module")
def capture():
    return object()

@pytest.fixture
def derived(capture, tmp_path):
    return capture

@pytest.fixture(scope="session")
def per_worker():
    return 1

class TestShared:
    @pytest.fixture(scope="class")
    def per_class(self):
        return 2

    def test_class_fixture(self, per_class):
        pass

def test_direct(capture):
    pass

def test_through_another_fixture(derived):
    pass

def test_alone(tmp_path, per_worker):
    pass

@pytest.mark.xdist_group("serial")
def test_own_group(capture):
    pass
"""


def groups(items) -> dict[str, list[str]]:
    return {item.name: [mark.args[0] for mark in item.iter_markers("xdist_group")]
            for item in items}


def test_users_of_a_module_or_class_fixture_share_their_modules_group(pytester: pytest.Pytester):
    items = pytester.getitems(MODULE)
    assert shared_fixtures(next(i for i in items if i.name == "test_through_another_fixture")) == [
        "capture"]
    assert group_shared_fixture_users(items) == 3
    module = items[0].nodeid.split("::")[0]
    assert module.endswith(".py")
    assert groups(items) == {
        "test_class_fixture": [module],
        "test_direct": [module],
        "test_through_another_fixture": [module],
        "test_alone": [],  # function and session fixtures only: balanced on its own
        "test_own_group": ["serial"],  # a group the test names is kept
    }


def test_slow_tests_are_handed_out_first_in_their_order(pytester: pytest.Pytester):
    items = pytester.getitems("""
import pytest

def test_fast_one():
    pass

@pytest.mark.slow
def test_slow_one():
    pass

def test_fast_two():
    pass

@pytest.mark.slow
def test_slow_two():
    pass
""")
    slow_first(items)
    assert [item.name for item in items] == [
        "test_slow_one", "test_slow_two", "test_fast_one", "test_fast_two"]
    assert not is_slow(items[-1]) and is_slow(items[0])
