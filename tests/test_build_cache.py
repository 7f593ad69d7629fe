"""The build cache trusts nothing it finds on disk: a library or a precompiled header that is not what the
build that made it recorded is rebuilt, never loaded (a cache is kept across runs, and a run with
`--sandbox off`, or anyone else, may have changed it). Nor does it trust what a candidate asks it to build: a
flag that is not one plain argument, or that would write elsewhere, is refused before anything is compiled; and
no compile child that builds an extension may write what other builds read."""
import itertools
import re
import threading
import time
from pathlib import Path

import pytest

from kevin import build_cache
from kevin import evaluator as ev
from kevin.eval_records import library_records
from kevin import isolation
from kevin import sandbox

ROOT = Path(__file__).resolve().parents[1]
CPU = dict(device="cpu", tasks=str(ROOT / "tests" / "tasks"), timing_budget_s=1.0, progress=False)

slow = pytest.mark.slow
needs_landlock = pytest.mark.skipif(not sandbox.available()["landlock"], reason="the kernel has no Landlock")
RELU = """
torch::Tensor relu(torch::Tensor x) {
    auto out = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* result = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) result[i] = in[i] > 0.f ? in[i] : 0.f;
    return out;
}
"""


def solution(stem: str, name: str | None = None) -> dict:
    record = next(r for r in library_records(ROOT / "solutions" / "cpu") if r["solution"].endswith(stem))
    return {**record, "code": re.sub(r'name="\w+"', f'name="{name}"', record["code"], count=1)} if name else record


@slow
def test_a_changed_library_light_header_or_precompiled_header_is_made_again_not_loaded(tmp_path, new_build_dir):
    """After a first run, what a candidate (or a run with `--sandbox off`) could leave in the cache: a library, the
    light torch/types.h that every build includes and its precompiled header, each replaced (the cache reads
    their contents; the headers' old files are links other tests read). A later run builds the library again
    rather than load it, writes the header's text back before a build reads it, and makes the precompiled header
    again; both candidates are correct."""
    builds = new_build_dir(tmp_path)
    cfg = ev.EvalConfig(**dict(CPU, build_dir=str(builds)))
    assert [e["status"] for e in ev.evaluate([solution("7_ReLU.correct_loop")], cfg)] == ["correct"]
    [library] = [p for p in builds.glob("*/*.so")]
    [light] = (builds / "light").iterdir()
    types_h, pch = light / "torch" / "types.h", light / "torch" / "extension.h.gch"
    guard_h = light / "ATen" / "DeviceGuard.h"
    assert build_cache._matches_digest(library) and build_cache._matches_digest(pch)
    for path, text in ((library, b"a library a candidate wrote: loading it would run its code"),
                       (types_h, b'#error "what a compile child left for the next build to include"\n'),
                       (guard_h, b'#error "what every per-operator header would include"\n'),
                       (pch, b"a header a candidate wrote: every later build would include it")):
        path.unlink()
        path.write_bytes(text)

    later = ev.evaluate([solution("7_ReLU.correct_loop", name="relu_again"), solution("9_Swish.correct_fused")], cfg)
    assert [e["status"] for e in later] == ["correct", "correct"], [e["feedback"] for e in later]
    assert library.read_bytes()[:4] == b"\x7fELF" and build_cache._matches_digest(library)
    assert types_h.read_text() == build_cache._LIGHT_TYPES_H and build_cache._matches_digest(pch)
    assert guard_h.read_text() == build_cache._LIGHT_DEVICE_GUARD_H


def test_a_library_without_a_recorded_digest_is_not_trusted(tmp_path):
    library = tmp_path / "ext.so"
    library.write_bytes(b"\x7fELF built by someone")
    assert not build_cache._matches_digest(library)
    build_cache._record_digest(library)
    assert build_cache._matches_digest(library)
    library.write_bytes(b"\x7fELF changed since")
    assert not build_cache._matches_digest(library)


def relu(name: str, **flags) -> dict:
    """load_inline's arguments for a ReLU extension, as a candidate's load_inline sends them."""
    return {"name": name, "cpp_sources": RELU, "functions": ["relu"], "extra_cflags": ["-O3"], **flags}


def cache_compiling_in_children(tmp_path: Path, slots: int = 1) -> build_cache.BuildCache:
    """A build cache under tmp_path whose compiles run as the evaluator runs them: in compile children, boxed in
    with every mechanism this kernel has, each writing only what the cache names."""
    readable = sandbox.readable([str(tmp_path), str(ROOT)], isolation.hidden_from_children())
    settings = isolation.ChildSettings(env={}, readable=tuple(readable), mechanisms=sandbox.available(), nice=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "cache").mkdir()
    count = itertools.count()

    def compile(payload: dict, writable: list[str], timeout_s: float) -> dict:
        log = str(tmp_path / "logs" / f"compile-{next(count)}.log")
        return isolation.run_in_child(build_cache.compile_extension, payload, settings, timeout_s, log, writable)

    return build_cache.BuildCache(tmp_path / "cache", "", slots, compile, 600)


def test_flags_that_are_not_one_plain_argument_or_that_write_elsewhere_are_refused():
    for flags in (["-O3", "--use_fast_math"], ["-gencode", "arch=compute_90,code=sm_90"], ["-Xptxas -v"],
                  ["-DBLOCK=256", "-std=c++17", "-I/usr/include"], ["-Wl,-rpath,/usr/lib", "-lm"],
                  ["-Xcompiler=-fopenmp"], [" -O2 "]):
        assert build_cache.refused_argument({"name": "ext", "extra_cuda_cflags": flags}) is None, flags
    shell, writes = "the build passes it to a shell unquoted", "write a file it names, or run a program"
    for flag, why in {"-O3;touch pwned;": shell, "-DX=$(touch pwned)": shell, "-DX=`id`": shell, '-DX="1"': shell,
                      "-O3\ntouch pwned": shell, "@/tmp/more_options": shell, "/tmp/evil.o": "is not a flag",
                      "-o/tmp/elsewhere.so": writes, "-MF /tmp/deps": writes, "-Wl,-Map=/tmp/map": writes,
                      "-Wl,--version-script=/tmp/v": writes, "-fplugin=/tmp/p.so": writes, "-B/tmp": writes,
                      "-specs=/tmp/s": writes, "--linker-options=-o,/tmp/x": writes, "-save-temps=cwd": writes,
                      "-Xcompiler=-o,/tmp/x": writes, "-Xcompiler -wrapper,/tmp/run": writes}.items():
        message = build_cache.refused_argument({"name": "ext", "extra_ldflags": ["-O3", flag]})
        assert message.startswith(f"extra_ldflags: {flag!r} is refused: ") and why in message, message
        assert "\n" not in message
    assert "include path" in build_cache.refused_argument({"name": "ext", "extra_include_paths": ["/tmp/$(id)"]})
    assert "include path" in build_cache.refused_argument({"name": "ext", "extra_include_paths": ["-o/tmp/x"]})
    assert "identifier" in build_cache.refused_argument({"name": "ext;touch pwned"})
    assert "list of strings" in build_cache.refused_argument({"name": "ext", "extra_cflags": "-O3"})


def test_a_refused_flag_is_a_build_error_and_nothing_is_built(tmp_path):
    """The flag's `;` would run `touch pwned` in the compile child, in the extension's folder, where ninja runs."""
    cache = cache_compiling_in_children(tmp_path)
    reply = cache.request(relu("relu_refused", extra_cflags=["-O3;touch pwned;"]))
    assert set(reply) == {"error"} and re.fullmatch(
        r"Error building extension 'ext_\w+': extra_cflags: '-O3;touch pwned;' is refused: a flag must be plain "
        r"words \(.*\): the build passes it to a shell unquoted", reply["error"]), reply
    assert not list(tmp_path.rglob("pwned")) and not list(tmp_path.rglob("build.ninja"))
    assert not list((tmp_path / "logs").iterdir())  # no compile child was started


@slow
def test_a_runs_request_waits_for_its_extensions_build_and_for_no_other(tmp_path):
    """Two compile slots. A build child's thread holds one and builds a ReLU; a second, holding the other, asks for
    the same extension, gives its slot back and waits; a third candidate's build takes that slot and keeps it.
    Once the ReLU is built, a runner's request for it (its run timeout ticking) is answered at once: the waiter,
    which needs no slot to find the ReLU built, must not keep the extension's lock while it waits for one (it did,
    and with the slots busy with other builds an honest kernel timed out in the suite)."""
    cache = cache_compiling_in_children(tmp_path, slots=2)
    built, third_holds, release = threading.Event(), threading.Event(), threading.Event()

    def build_child(then: threading.Event | None = None):  # a build child's job holds its slot throughout
        with cache.slot():
            if then is third_holds:
                third_holds.set()
            else:
                assert "library" in cache.request(relu("relu_shared"))
                if then is not None:
                    then.set()
            release.wait()

    first = threading.Thread(target=build_child, args=(built,))
    first.start()
    while not list((tmp_path / "logs").iterdir()):  # its compile child has started: the extension's lock is held
        time.sleep(0.01)
    children = [first, threading.Thread(target=build_child), threading.Thread(target=build_child, args=(third_holds,))]
    children[1].start()
    children[2].start()  # it gets a slot only once the second has given its own back
    assert third_holds.wait(60) and built.wait(300)
    answered = {}
    runner = threading.Thread(target=lambda: answered.update(cache.request(relu("relu_shared"))))
    started = time.perf_counter()
    runner.start()
    runner.join(timeout=30)
    waited = time.perf_counter() - started
    release.set()
    for child in [*children, runner]:
        child.join()
    assert "library" in answered and waited < 10, waited


@slow
@needs_landlock
def test_a_build_cannot_write_the_light_headers_that_other_builds_read(tmp_path):
    """A linker flag the refusal lets through (ld takes --Ma for --Map) aims its map file at the light
    torch/types.h that every build with these compiler flags includes: the compile child may write only its
    extension's folder, so the write is denied (a failed build, or a warning, as ld's version has it) and the
    light folder stays as the evaluator left it."""
    cache = cache_compiling_in_children(tmp_path)
    assert "library" in cache.request(relu("relu_first"))
    [light] = (tmp_path / "cache" / "light").iterdir()
    before = {p: p.read_bytes() for p in light.rglob("*") if p.is_file()}
    assert light / "torch" / "extension.h.gch" in before
    cache.request(relu("relu_attack", extra_ldflags=[f"-Wl,--Ma={light}/torch/types.h"]))
    assert {p: p.read_bytes() for p in light.rglob("*") if p.is_file()} == before
