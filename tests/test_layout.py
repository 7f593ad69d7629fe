"""The repository's layout holds: a stage script imports the package and the libraries, never another stage, and
nothing in the package imports a stage (what two stages share lives in kevin/)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = sorted(path.stem for path in ROOT.glob("*.py"))


def imported_modules(path: Path) -> set[str]:
    """Every top-level module name `path` imports, wherever in the file (inside functions too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_stages_are_the_scripts_at_the_top():
    assert STAGES == ["evaluate", "generate", "reward", "scale_test", "train", "warm_start"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_no_other_stage(stage):
    assert not imported_modules(ROOT / f"{stage}.py") & set(STAGES), f"{stage}.py imports a stage"


def test_the_package_imports_no_stage():
    importers = {path.name: sorted(imported_modules(path) & set(STAGES)) for path in (ROOT / "kevin").glob("*.py")}
    assert {name: stages for name, stages in importers.items() if stages} == {}
