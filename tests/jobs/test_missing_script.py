"""A program on PATH given in place of a Python script is named as such (jobs/runner.py)."""

import pytest

from peakmem.estimate import EstimateError
from peakmem.estimate.api import _check_command
from peakmem.jobs.runner import missing_script


def test_a_program_on_path_is_named_a_program():
    assert missing_script("bash").startswith("script not found: bash (bash is a program, not")
    assert missing_script("no_such_train.py") == "script not found: no_such_train.py"
    assert missing_script("no-such-program-x21") == "script not found: no-such-program-x21"


def test_the_estimate_refuses_it_as_bad_input():
    with pytest.raises(EstimateError, match=r"script not found: bash \(bash is a program") as err:
        _check_command(["bash", "-c", "true"])
    assert err.value.exit_code == 2
