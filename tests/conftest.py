"""Run in parallel (`-n 2 --dist loadgroup`, as the README runs the suite), the tests that share a module-scoped
fixture of their file go to one worker together, so that what it makes (a batch of evaluated kernels, a tiny
model's rollouts) is made once; every other test goes wherever a worker is free."""
import fcntl
import os
import shutil
from pathlib import Path

import pytest

from kevin import evaluator as ev

from kevin.eval_records import library_records

ROOT = Path(__file__).resolve().parents[1]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """The tests that share a module-scoped fixture of a test file, directly or through another, form one group
    (a fixture is made on one worker only); under xdist the groups go first: each is a long unit of work, and
    one begun last keeps a worker busy after the other has run out of tests."""
    parent: dict[str, str] = {}

    def group_of(name: str) -> str:
        while parent.setdefault(name, name) != name:
            name = parent[name]
        return name

    shared = {}
    for item in items:
        fixtures = [defs[-1] for defs in item._fixtureinfo.name2fixturedefs.values()]
        shared[item] = [f"{f.baseid}::{f.argname}" for f in fixtures
                        if f.scope != "function" and f.baseid.endswith(".py")]  # defined in a test file
        for a, b in zip(shared[item], shared[item][1:]):
            parent[group_of(a)] = group_of(b)
    for item, names in shared.items():
        if names:
            item.add_marker(pytest.mark.xdist_group(group_of(names[0]).replace("/", ".")))
    if getattr(config.option, "loadgroup", False):  # an xdist worker's collection, which the scheduler follows
        items.sort(key=lambda item: not shared[item])


@pytest.fixture(scope="session", autouse=True)
def no_precompiled_header_left(tmp_path_factory):
    """A precompiled header (336 MB) is a cache that any run makes again, never what a failed test's folder is kept
    for: once this process's tests are done, none is left in its folders (pytest keeps them all when one fails)."""
    yield
    for header in tmp_path_factory.getbasetemp().rglob("*.gch"):
        header.unlink()


@pytest.fixture(scope="session")
def new_build_dir(tmp_path_factory):
    """A function that makes a build cache of a test's own at the folder it names, its light headers already
    precompiled (made once per run, by whichever worker asks first, and hard-linked in: each costs ~15 s of a core
    and 336 MB). Its candidates are all built; a test of how the light headers are made or kept starts from an
    empty folder instead. The last worker done with it empties it (one that asks later makes it again)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER")  # the workers' folders share the run's folder
    made = tmp_path_factory.getbasetemp().parent / "precompiled" if workers else tmp_path_factory.mktemp("precompiled")
    made.mkdir(exist_ok=True)
    users = open(made / "users", "a")  # locked shared by each worker that may still link from it
    fcntl.flock(users, fcntl.LOCK_SH)
    with open(made / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (made / "made").exists():
            relu = next(r for r in library_records(ROOT / "solutions" / "cpu")
                        if r["solution"].endswith("correct_loop"))
            [result] = ev.evaluate([relu], ev.EvalConfig(device="cpu", tasks=str(ROOT / "tests" / "tasks"),
                                                         build_dir=str(made), timing_budget_s=0.0, progress=False))
            assert result["status"] == "correct", result["feedback"]
            (made / "made").touch()

    def make(folder: Path) -> Path:
        shutil.copytree(made / "light", folder / "light", copy_function=os.link,
                        ignore=shutil.ignore_patterns("lock"))  # a lock of its own: flock holds per file, not per link
        return folder
    yield make
    with users:
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another worker still links from it
            return
        for path in made.iterdir():
            if path.is_dir():
                shutil.rmtree(path)
            elif path.name not in ("users", "lock"):
                path.unlink()
