"""The dataset layer sits below both baselines and bench: check the import direction from the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "peakmem"


def imported_modules(source: str, package: str) -> set[str]:
    """Every absolute module name `source` (a module of `package`) imports, relative ones resolved."""
    tree = ast.parse(source)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def imports_of(package: str) -> dict[str, set[str]]:
    return {
        str(path.relative_to(SRC)): imported_modules(
            path.read_text(encoding="utf-8"), ".".join(("peakmem", *path.relative_to(SRC).parent.parts))
        )
        for path in sorted((SRC / package).rglob("*.py"))
    }


def reaches(names: set[str], package: str) -> list[str]:
    target = f"peakmem.{package}"
    return sorted(n for n in names if n == target or n.startswith(target + "."))


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("baselines", "bench"), ("datasets", "bench"), ("datasets", "baselines")],
)
def test_lower_layer_does_not_import_upper(package: str, forbidden: str) -> None:
    bad = {f: reaches(names, forbidden) for f, names in imports_of(package).items()}
    bad = {f: hits for f, hits in bad.items() if hits}
    assert not bad, f"peakmem.{package} must not import peakmem.{forbidden}: {bad}"


def test_checker_sees_relative_and_absolute_imports() -> None:
    """The checker itself can fail: every import spelling of bench is found."""
    for text in (
        "from peakmem.bench.rows import BenchRow\n",
        "from ..bench import runner\n",
        "from .. import bench\n",
        "import peakmem.bench.report as r\n",
        "def f():\n    from peakmem.bench.metrics import RowResult\n",
    ):
        assert reaches(imported_modules(text, "peakmem.baselines"), "bench"), text
    assert not reaches(imported_modules("from peakmem.datasets.rows import MiB\n", "peakmem.baselines"), "bench")
