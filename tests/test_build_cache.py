"""The build cache trusts nothing it finds on disk: a library or a precompiled header that is not what the
build that made it recorded is rebuilt, never loaded (a cache is kept across runs, and a run with
`--sandbox off`, or anyone else, may have changed it)."""
import re
from pathlib import Path

import pytest

import build_cache
import evaluate as ev

ROOT = Path(__file__).resolve().parents[1]
CPU = dict(device="cpu", tasks=str(ROOT / "tests" / "tasks"), timing_budget_s=1.0, progress=False)

pytestmark = pytest.mark.slow


def solution(stem: str, name: str | None = None) -> dict:
    record = next(r for r in ev.library_records(ROOT / "solutions" / "cpu") if r["solution"].endswith(stem))
    return {**record, "code": re.sub(r'name="\w+"', f'name="{name}"', record["code"], count=1)} if name else record


def test_a_changed_library_or_precompiled_header_is_rebuilt_not_loaded(tmp_path):
    cfg = ev.EvalConfig(**dict(CPU, build_dir=str(tmp_path)))
    assert [e["status"] for e in ev.evaluate([solution("7_ReLU.correct_loop")], cfg)] == ["correct"]
    [library] = [p for p in tmp_path.glob("*/*.so")]
    [pch] = tmp_path.glob("light/*/torch/extension.h.gch")
    assert build_cache._matches_digest(library) and build_cache._matches_digest(pch)
    library.write_bytes(b"a library a candidate wrote: loading it would run its code")
    pch.write_bytes(b"a header a candidate wrote: every later build would include it")

    later = ev.evaluate([solution("7_ReLU.correct_loop", name="relu_again"), solution("9_Swish.correct_fused")], cfg)
    assert [e["status"] for e in later] == ["correct", "correct"], [e["feedback"] for e in later]
    assert library.read_bytes()[:4] == b"\x7fELF" and build_cache._matches_digest(library)
    assert not pch.exists() or build_cache._matches_digest(pch)


def test_a_library_without_a_recorded_digest_is_not_trusted(tmp_path):
    library = tmp_path / "ext.so"
    library.write_bytes(b"\x7fELF built by someone")
    assert not build_cache._matches_digest(library)
    build_cache._record_digest(library)
    assert build_cache._matches_digest(library)
    library.write_bytes(b"\x7fELF changed since")
    assert not build_cache._matches_digest(library)
