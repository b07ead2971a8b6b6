import pytest

from peakmem.profiles import load_gpu, load_stack


@pytest.fixture
def a100():
    return load_gpu("a100-40gb")


@pytest.fixture
def stack24():
    return load_stack("2.4.1")
