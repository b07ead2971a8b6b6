"""torchtune's built-in recipes and configs, as `tune run` resolves them, without importing
torchtune (which imports torch).

`tune run NAME --config CFG` runs ``<site-packages>/recipes/<recipe file>`` when NAME is a
built-in recipe, and reads ``<site-packages>/recipes/configs/<config file>`` when CFG is a
built-in config name (torchtune 0.6 ``_cli/run.py``); both lists live in
``torchtune/_recipe_registry.py`` as literal ``Recipe(...)`` / ``Config(...)`` calls, read here
with :mod:`ast` (parsed as data, never executed).
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

REGISTRY_FILE = "_recipe_registry.py"
MAX_REGISTRY_BYTES = 1 << 20


@dataclass(frozen=True)
class BuiltinRecipe:
    name: str
    path: Path
    """The recipe script (``<site-packages>/recipes/<file>``)."""
    configs: dict[str, Path]
    """Built-in config name -> its YAML file."""
    supports_distributed: bool


def torchtune_root() -> Path | None:
    """The directory holding the installed `torchtune` package and its `recipes` (None when
    torchtune is not installed)."""
    spec = importlib.util.find_spec("torchtune")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def _keywords(call: ast.Call) -> dict[str, ast.expr]:
    return {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}


def _text(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _calls_named(node: ast.AST, name: str) -> list[ast.Call]:
    return [call for call in ast.walk(node) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name) and call.func.id == name]


@lru_cache(maxsize=4)
def builtin_recipes(root: Path) -> dict[str, BuiltinRecipe]:
    """Recipe name -> its script and configs, from torchtune's registry under `root`."""
    registry = root / "torchtune" / REGISTRY_FILE
    try:
        source = registry.read_text(encoding="utf-8")[:MAX_REGISTRY_BYTES]
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return {}
    recipes: dict[str, BuiltinRecipe] = {}
    for call in _calls_named(tree, "Recipe"):
        fields = _keywords(call)
        name, file_path = _text(fields.get("name")), _text(fields.get("file_path"))
        if name is None or file_path is None:
            continue
        configs: dict[str, Path] = {}
        for config in _calls_named(fields.get("configs", ast.List(elts=[])), "Config"):
            config_fields = _keywords(config)
            config_name = _text(config_fields.get("name"))
            config_file = _text(config_fields.get("file_path"))
            if config_name is not None and config_file is not None:
                configs[config_name] = root / "recipes" / "configs" / config_file
        distributed = fields.get("supports_distributed")
        recipes[name] = BuiltinRecipe(
            name, root / "recipes" / file_path, configs,
            bool(distributed.value) if isinstance(distributed, ast.Constant) else False)
    return recipes


def builtin_config(root: Path, name: str, recipe: BuiltinRecipe | None) -> Path | None:
    """The YAML file of built-in config `name` (the recipe's own first, then any recipe's, as
    `tune run` looks it up); None when `name` is not a built-in config."""
    if recipe is not None and name in recipe.configs:
        return recipe.configs[name]
    for other in builtin_recipes(root).values():
        if name in other.configs:
            return other.configs[name]
    return None
