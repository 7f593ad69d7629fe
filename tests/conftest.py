"""Run in parallel (`-n 2 --dist loadgroup`, as the README runs the suite), the tests that share a module-scoped
fixture of their file go to one worker together, so that what it makes (a batch of evaluated kernels, a tiny
model's rollouts) is made once; every other test goes wherever a worker is free."""
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        fixtures = [defs[-1] for defs in item._fixtureinfo.name2fixturedefs.values()]
        if any(f.scope != "function" and f.baseid for f in fixtures):  # a baseid: defined in a test file, not pytest
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
