"""sandbox.confine on a real forked process: what a boxed-in child can and cannot reach."""
import json
import os
import signal
import socket

import pytest

import sandbox

MECHANISMS = sandbox.available()


def confined(tmp_path, probe, mechanisms=None, hidden=()):
    """Run `probe()` in a forked child boxed in with only tmp_path/own writable; its JSON answer, or the
    signal that killed it."""
    own = tmp_path / "own"
    own.mkdir(exist_ok=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            sandbox.confine([str(own)], sandbox.readable([str(tmp_path)], list(hidden)), mechanisms or MECHANISMS)
            answer = probe(own)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            answer = {"error": repr(e)}
        os.write(write_end, json.dumps(answer).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return json.loads(text)


def attempt(action) -> str:
    try:
        action()
        return "done"
    except OSError as e:
        return e.strerror


needs_landlock = pytest.mark.skipif(not MECHANISMS["landlock"], reason="the kernel has no Landlock")


@needs_landlock
def test_a_confined_child_writes_its_own_folder_and_nothing_else(tmp_path):
    outside = tmp_path / "project.py"
    outside.write_text("original\n")

    def probe(own):
        return {"own": attempt(lambda: (own / "build.o").write_text("x")),
                "outside": attempt(lambda: open(outside, "a").write("tampered\n")),
                "delete": attempt(lambda: os.unlink(outside))}

    answer = confined(tmp_path, probe)
    assert answer == {"own": "done", "outside": "Permission denied", "delete": "Permission denied"}
    assert outside.read_text() == "original\n"


@needs_landlock
def test_a_confined_child_cannot_reach_its_parents_file_descriptors_or_folder(tmp_path):
    parent = os.getpid()
    answer = confined(tmp_path, lambda own: {
        "stdout": attempt(lambda: open(f"/proc/{parent}/fd/1", "w")),
        "cwd": attempt(lambda: os.readlink(f"/proc/{parent}/cwd")),
        "memory": attempt(lambda: open(f"/proc/{parent}/mem", "rb"))})
    assert set(answer.values()) == {"Permission denied"}


@needs_landlock
def test_a_hidden_folder_cannot_be_listed_though_its_siblings_are_read(tmp_path):
    (tmp_path / "secret").mkdir()
    (tmp_path / "readable.txt").write_text("fine")
    answer = confined(tmp_path, lambda own: {"list": attempt(lambda: os.listdir(tmp_path / "secret")),
                                             "parent": attempt(lambda: os.listdir(tmp_path))},
                      hidden=[str(tmp_path / "secret")])
    assert answer == {"list": "Permission denied", "parent": "Permission denied"}  # the holder is dropped whole
    assert sandbox.readable([str(tmp_path / "readable.txt")], [str(tmp_path / "secret")]).count(
        str(tmp_path / "readable.txt")) == 1


@pytest.mark.skipif(not MECHANISMS["seccomp"], reason="the kernel has no seccomp")
def test_an_internet_socket_kills_the_child_with_sigsys(tmp_path):
    answer = confined(tmp_path, lambda own: {"socket": attempt(lambda: socket.socket(socket.AF_INET))})
    assert answer == {"signal": signal.SIGSYS}


@pytest.mark.skipif(not MECHANISMS["seccomp"], reason="the kernel has no seccomp")
def test_a_unix_socket_pair_still_works_under_seccomp(tmp_path):
    answer = confined(tmp_path, lambda own: {"pair": attempt(socket.socketpair)})
    assert answer == {"pair": "done"}


@pytest.mark.skipif(not MECHANISMS["namespaces"], reason="no user and network namespaces here")
def test_the_network_namespace_has_no_route_to_localhost(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def probe(own):
        s = socket.socket()
        return {"connect": attempt(lambda: s.connect(("127.0.0.1", port)))}

    answer = confined(tmp_path, probe, mechanisms=dict(MECHANISMS, seccomp=False))
    listener.close()
    assert answer["connect"] in ("Network is unreachable", "Permission denied")


def test_describe_names_what_is_on_and_what_is_missing():
    line = sandbox.describe({"landlock": False, "namespaces": True, "seccomp": True})
    assert line.startswith("sandbox: user+network namespaces")
    assert line.endswith("not available here: landlock")
    assert sandbox.describe({}) == "sandbox: off"


def test_a_made_up_request_from_a_child_is_answered_with_an_error_not_a_crash(tmp_path):
    """A child may send the evaluator anything; a request its service cannot take must come back as an error
    to that child, not end the evaluation."""
    import isolation

    def serve(request):
        return {"library": request["arguments"]["name"]}  # a TypeError for the list the child below sends

    settings = isolation.ChildSettings(env={})
    outcome = isolation.run_in_child(ask_something_odd, {}, settings, 60, str(tmp_path / "child.log"), serve=serve)
    assert outcome["reply"]["error"].startswith("a request the evaluator cannot answer: TypeError")


def ask_something_odd(payload: dict) -> dict:
    """A child's job that sends the evaluator a request of no known shape and returns what it was told."""
    import json
    import sys

    conn = next(o for o in __import__("gc").get_objects() if type(o).__name__ == "Connection" and not o.closed)
    conn.send_bytes(json.dumps({"request": ["not", "a", "dict"]}).encode())
    sys.stdout.flush()
    return {"reply": conn.recv()}
