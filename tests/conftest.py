"""Run in parallel (`-n 2 --dist loadgroup`, as the README runs the suite), the tests that share a module-scoped
fixture of their file go to one worker together, so that what it makes (a batch of evaluated kernels, a tiny
model's rollouts) is made once; every other test goes wherever a worker is free."""
import os
import shutil
from pathlib import Path

import pytest

import evaluate as ev

ROOT = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = [defs[-1] for defs in item._fixtureinfo.name2fixturedefs.values()]
        if any(f.scope != "function" and f.baseid.endswith(".py") for f in fixtures):  # defined in a test file
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


@pytest.fixture(scope="session")
def new_build_dir(tmp_path_factory):
    """A function that makes a build cache of a test's own at the folder it names, its light headers already
    precompiled (made once per session and hard-linked in: each costs ~15 s of a core and 336 MB). Its candidates
    are all built; a test of how the light headers are made or kept starts from an empty folder instead."""
    made = tmp_path_factory.mktemp("precompiled")
    relu = next(r for r in ev.library_records(ROOT / "solutions" / "cpu") if r["solution"].endswith("correct_loop"))
    [result] = ev.evaluate([relu], ev.EvalConfig(device="cpu", tasks=str(ROOT / "tests" / "tasks"), build_dir=str(made),
                                                 timing_budget_s=0.0, progress=False))
    assert result["status"] == "correct", result["feedback"]

    def make(folder: Path) -> Path:
        shutil.copytree(made / "light", folder / "light", copy_function=os.link)
        return folder
    return make
