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


@pytest.mark.xdist_group("layout")
def test_tests_that_share_a_fixture_run_on_one_worker(request):
    """Run as the README runs the suite (`-n 2 --dist loadgroup`), a test's group is in its id, where pytest-xdist's
    scheduler reads it: with pytest 9.2 and pytest-xdist 3.8 it was not, each worker made every module fixture its
    tests needed (the sandbox's batch of attacks twice, 5 minutes)."""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@layout"), "pip install -r requirements.txt: it keeps pytest below 9.2"
