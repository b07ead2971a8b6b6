"""`tune run` on one device appends the working directory to `sys.path` before it runs the recipe
in its own process (torchtune `_cli/run.py`: "Make sure user code in current directory is
importable"); `peakmem estimate -- tune run ...` gives the recipe the same `sys.path`."""

from __future__ import annotations

import json
import textwrap

import pytest

from peakmem.estimate import EstimateError, estimate_command
from peakmem.jobs import torchtune_recipes
from peakmem.jobs.launchers import APPEND_CWD_ENV, parse_launch

GPU = {"gpu": "a100-40gb", "torch_version": "2.4.1"}
ELEMENTS = 1 << 20

RECIPE = textwrap.dedent("""
    import json, os, sys
    import torch
    import user_components  # in the working directory: importable only as `tune run` runs it
    with open("seen.json", "w") as out:
        json.dump({"last": sys.path[-1] == os.getcwd(), "first": sys.path[0]}, out)
    weights = torch.zeros(user_components.N, device="cuda")
""")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An installed-looking torchtune with one built-in recipe, and a working directory with the
    user's own module the recipe imports."""
    site = tmp_path / "site"
    (site / "torchtune").mkdir(parents=True)
    (site / "recipes").mkdir()
    (site / "torchtune" / "_recipe_registry.py").write_text(
        'Recipe(name="my_recipe", file_path="my_recipe.py", configs=[], '
        "supports_distributed=False)\n")
    (site / "recipes" / "my_recipe.py").write_text(RECIPE)
    work = tmp_path / "work"
    work.mkdir()
    (work / "user_components.py").write_text(f"N = {ELEMENTS}\n")
    (work / "cfg.yaml").write_text("{}\n")
    monkeypatch.setattr(torchtune_recipes, "torchtune_root", lambda: site)
    monkeypatch.chdir(work)
    return site, work


def test_a_one_device_tune_run_appends_the_cwd_for_its_recipe(workdir):
    site, work = workdir
    launch = parse_launch(["tune", "run", "my_recipe", "--config", "cfg.yaml"])
    assert not launch.distributed and launch.env == {APPEND_CWD_ENV: "1"}
    assert launch.command[1] == str(site / "recipes" / "my_recipe.py")

    result = estimate_command(["tune", "run", "my_recipe", "--config", "cfg.yaml"], **GPU)
    assert result.peak_allocated_bytes >= ELEMENTS * 4
    seen = json.loads((work / "seen.json").read_text())
    # appended after everything else, as tune does; the script's own directory stays first
    assert seen == {"last": True, "first": str(site / "recipes")}


def test_the_same_recipe_run_by_python_cannot_import_the_users_module(workdir):
    site, _work = workdir
    with pytest.raises(EstimateError, match="user_components"):
        estimate_command(["python", str(site / "recipes" / "my_recipe.py"), "--config",
                          "cfg.yaml"], **GPU)


def test_a_torchrun_tune_run_leaves_sys_path_to_its_ranks(workdir):
    launch = parse_launch(["tune", "run", "--nproc_per_node", "2", "my_lora.py", "--config",
                           "cfg.yaml"])
    assert launch.distributed and APPEND_CWD_ENV not in launch.env
