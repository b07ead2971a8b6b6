"""What `pip install .` gives a user: a light install, `peakmem --version`, the bundled example."""

from __future__ import annotations

import tomllib
from pathlib import Path

from click.testing import CliRunner

from peakmem import __version__
from peakmem.cli.main import main

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_version() -> None:
    out = CliRunner().invoke(main, ["--version"])
    assert out.exit_code == 0
    assert out.output.strip() == f"peakmem, version {__version__}"


def test_user_install_has_no_development_tools() -> None:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    names = {dep.split(">")[0].split("=")[0].split("[")[0].strip().lower()
             for dep in project["dependencies"]}
    assert names == {"torch", "click", "rich", "numpy", "sortedcontainers"}
    extras = project["optional-dependencies"]
    assert {"pytest", "ruff", "hypothesis"} <= {d.split(">")[0] for d in extras["dev"]}
    assert {"plotly", "matplotlib"} <= {d.split(">")[0] for d in extras["plots"]}


def test_bundled_example_is_package_data() -> None:
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]
    assert "examples/*.py" in config["peakmem"]
    import peakmem.examples.mlp_train as example

    assert Path(example.__file__).is_file()
