"""The judge's own arithmetic (kevin/judge_checks.py): the comparison with its scale-aware check, the clocks it
reads, the time it observes from outside the candidate's process; and from kevin/judge.py, the runner's CPU clock
and its stop, the moved draws, and the shared memory the runner answers through.

The numbers are made by hand; the processes these checks run in are exercised through the real command line
in tests/test_evaluate.py (the adversarial candidates) and tests/test_judging.py."""
import json
import multiprocessing as mp
import hashlib
import os
import threading
import time

import pytest
import torch

from kevin import judge as jg
from kevin import judge_checks as checks
from kevin.tensor_exchange import Arena

TOLERANCE = {"float32": [1e-2, 1e-2], "other": [1e-2, 1e-2]}


def taken(*tensors) -> list[dict]:
    """Outputs as the judge takes them from the runner: each tensor's description and its copy."""
    return [{"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."), "value": t} for t in tensors]


def test_zeros_under_a_tolerance_larger_than_every_value_are_incorrect():
    """A softmax over 65,536 columns: every value ~1.5e-5, far below atol = 1e-2, so allclose passes zeros."""
    reference = torch.softmax(torch.rand(4, 65536), dim=1)
    assert torch.allclose(torch.zeros_like(reference), reference, atol=1e-2, rtol=1e-2)
    status, why, _, _ = checks.compare(taken(torch.zeros_like(reference)), reference, TOLERANCE)
    assert status == "incorrect" and "of the order of the reference's own values" in why
    assert checks.compare(taken(reference * (1 + 1e-3)), reference, TOLERANCE)[0] is None  # a real softmax passes
    assert checks.compare(taken(torch.zeros(3)), torch.zeros(3), TOLERANCE)[0] is None  # zeros are right for zeros


def test_shape_dtype_and_what_is_not_a_tensor_are_told_apart():
    reference = torch.ones(2, 3)
    assert "shape mismatch" in checks.compare(taken(torch.ones(3, 2)), reference, TOLERANCE)[1]
    assert "dtype mismatch" in checks.compare(taken(torch.ones(2, 3, dtype=torch.float64)), reference, TOLERANCE)[1]
    assert checks.compare([{"type": "int"}], reference, TOLERANCE)[1] == "expected a tensor, got int"
    status, why, _, _ = checks.compare([{"not_plain": "a Deferred (torch.strided)"}], reference, TOLERANCE)
    assert status == "rejected" and why.startswith("[not-plain-tensor]")
    nan = torch.ones(2, 3)
    nan[0, 0] = float("nan")
    assert checks.compare(taken(nan), reference, TOLERANCE)[1].startswith("[nan-output] 1 NaN/Inf")


def test_repeats_compare_the_copies_taken_as_each_call_returned():
    """A buffer the candidate keeps and rewrites would compare equal to itself; the judge's copies do not."""
    first = torch.linspace(-1, 1, 1000)
    assert checks.repeat_disagrees(taken(first), taken(first.clone()), 1e-5) is None
    drifted = first.clone()
    drifted[17] += 1e-3
    assert "differs from the first by up to 0.001" in checks.repeat_disagrees(taken(first), taken(drifted), 1e-5)


def timed_calls(events_ms: float, wall_ms: float, kernel_ms: float, n: int = 5) -> tuple[list, dict, dict]:
    """n timed calls as the runner reports them, each with one kernel of `kernel_ms` starting 2 µs after its
    flush ended."""
    rows = [(f"candidate/{i}", events_ms, wall_ms) for i in range(n)]
    windows = {f"candidate/{i}": [("kernel", 1000.0 * i + 2, 1000.0 * i + 2 + kernel_ms * 1e3)] for i in range(n)}
    return rows, windows, {f"candidate/{i}": 1000.0 * i for i in range(n)}


def test_clocks_that_agree_pass_even_when_a_loaded_host_lost_time_around_the_events():
    assert checks.clock_mismatch(*timed_calls(0.30, 0.31, 0.29)) is None
    assert checks.clock_mismatch(*timed_calls(0.02, 0.94, 0.003)) is None  # a yield in the synchronize


def test_events_shorter_than_the_kernels_inside_them_or_longer_than_the_wall_clock_are_faked():
    assert checks.clock_mismatch(*timed_calls(0.025, 0.31, 0.29)).startswith(
        "[clock-mismatch] your timed calls take 0.025 ms by CUDA events")
    assert checks.clock_mismatch(*timed_calls(0.06, 0.03, 0.02)).startswith("[clock-mismatch]")
    assert checks.clock_mismatch(*timed_calls(0.0315, 0.03, 0.02)) is None  # within the events' resolution


def test_reported_calls_may_be_faster_than_the_logged_calls_kernels_by_the_logs_cost_and_no_more():
    """The reported calls run with the kernel log's GPU side off, the logged ones under it. Measured on the H200:
    a one-thread-per-element tanh over 16M floats, 0.415 ms unlogged, its kernel 0.451 ms logged; passes. A
    candidate that runs torch's vectorised kernel where the log is off (0.257 ms) and its own where it is on, or
    whose logged calls leave 0.29 ms of work on a side stream the events never wait for, or start it while the
    flush still runs (before the begin event), does not."""
    def logged(*kernels):
        rows = [(f"candidate/{i}", 0.46, 0.5) for i in range(1, 10, 2)]
        return rows, {label: [(name, 1000.0 * i + a, 1000.0 * i + b) for name, a, b in kernels]
                      for i, (label, _, _) in enumerate(rows)}

    reported = lambda ms: [(f"candidate/{i}", ms, ms + 0.01) for i in range(0, 10, 2)]  # noqa: E731
    rows, windows = logged(("tanh_kernel", 2, 453))
    assert checks.log_dodging(rows, reported(0.415), windows) is None
    assert checks.log_dodging(rows, reported(0.257), windows).startswith(
        "[log-dodging] your timed calls took 0.257 ms where the kernel log was off, and their kernels 0.451 ms")
    side, windows = logged(("k", 2, 10), ("side", 5, 300))  # events 0.01 ms in every call
    assert checks.log_dodging(side, reported(0.01), windows).startswith("[log-dodging]")
    early, windows = logged(("early", -100, 150))  # started 0.1 ms before the flush ended
    assert checks.log_dodging(early, reported(0.15), windows).startswith("[log-dodging]")
    assert checks.log_dodging([], reported(0.1), {}) is None  # no logged call: nothing to hold them to


def test_a_reported_time_shorter_than_the_judge_saw_beyond_the_harness_is_a_faked_clock():
    """The judge sees each call from request to answer; the harness alone (no model, before the candidate was
    imported, its outputs handed over as every call's are) took 0.05 ms beyond its report. An honest call leaves
    about that much; a clock that reads 20x short, or work put off until the outputs are handed over, leaves most
    of the call unexplained."""
    honest = [(f"candidate/{i}", 0.40, 0.41) for i in range(5)]
    seen = {label: (0.40e-3 + 0.06e-3, 0.0) for label, _, _ in honest}
    assert checks.unobserved_time(honest, seen, harness_ms=0.05) is None
    faked = [(label, 0.02, 0.02) for label, _, _ in honest]
    assert checks.unobserved_time(faked, seen, harness_ms=0.05).startswith("[clock-mismatch] each of your timed calls")
    assert checks.unobserved_time(faked, {**seen, "candidate/4": (0.05e-3, 0.0)}, 0.05) is None  # its least
    long = [(label, 6.0, 6.1) for label, _, _ in honest]  # a long call leaves more around it, a faked one most
    seen_long = {label: (7.34e-3, 0.0) for label, _, _ in long}
    assert checks.unobserved_time(long, seen_long, harness_ms=0.59) is None
    faked_long = [(label, 0.5, 0.5) for label, _, _ in long]
    assert checks.unobserved_time(faked_long, seen_long, harness_ms=0.59).startswith("[clock-mismatch]")


def test_a_slower_reference_stands_only_within_what_the_judges_own_kernel_says_of_the_load():
    clean = {"reference": 0.0226, "timer": 0.008}
    loaded = {"reference": [("r", 0.0917, 0.1)], "timer": [("t", 0.03, 0.03)]}
    assert checks.slowed_reference(loaded, clean, 1.3) is None  # the host slowed the judge's own kernel as much
    quiet = {"reference": [("r", 0.0917, 0.1)], "timer": [("t", 0.008, 0.01)]}
    assert checks.slowed_reference(quiet, clean, 1.3).startswith("[slowed-reference] the reference took 0.0917 ms")
    capped = {"reference": [("r", 0.2, 0.2)], "timer": [("t", 100.0, 100.0)]}
    assert checks.slowed_reference(capped, clean, 1.3).startswith("[slowed-reference]")  # load excuses 4x at most
    assert checks.slowed_reference(quiet, {}, 1.3) is None  # the CPU: the runner is stopped, nothing to compare


def test_a_process_cpu_time_keeps_what_its_exited_threads_spent():
    """A thread of this process hashing (the GIL let go) until it has spent 0.3 CPU-seconds, however busy the
    machine, then joined, while the main thread waits: gone by the time the clocks are read again, its CPU time
    still counts for the process, and the main thread's barely moves."""
    data = bytes(64 << 20)

    def hash_for_a_while():
        began = time.thread_time()
        while time.thread_time() - began < 0.3:
            hashlib.sha256(data).digest()

    worker = threading.Thread(target=hash_for_a_while)
    process, main = jg.runner_cpu_s(os.getpid())
    worker.start()
    worker.join()
    process_after, main_after = jg.runner_cpu_s(os.getpid())
    assert process_after - process > 0.25 and main_after - main < 0.1


def test_gpu_work_between_timed_calls_beyond_the_harnesss_copies_is_added_to_each_call():
    """Kernel times as the runner's profiler reports them (µs): clean calls each followed by a 10 µs copy of their
    outputs; a candidate whose calls are each followed by that copy and 200 µs of its own work (launched before
    its window opens, or as its outputs are handed over) is charged that work in each reported call; an honest
    one nothing. Only the gaps after logged calls count, the clean calls' as the candidate's: after an unlogged one
    the log's GPU side is off until its outputs are handed over, and its empty gap would halve the charge."""
    spans = {f"null/{i}": (1000 * i, 1000 * i + 50) for i in range(5)}
    between = [(1000 * i + 60, 1000 * i + 70) for i in range(5)]
    logged = {f"candidate/{i}" for i in range(1, 8, 2)} | {f"null/{i}" for i in range(0, 5, 2)}
    rows, honest, hidden = [], [], []
    for i in range(8):
        start = 10_000 + 1000 * i
        spans[f"candidate/{i}"] = (start, start + 30)
        if f"candidate/{i}" in logged:
            honest.append((start + 40, start + 50))
            hidden += [(start + 40, start + 50), (start + 500, start + 700)]
        else:
            rows.append((f"candidate/{i}", 0.02, 0.05))
    assert checks.charge_between_calls(rows, {"spans": spans, "between": between + honest}, logged) == (rows, 0.0)
    charged, extra = checks.charge_between_calls(rows, {"spans": spans, "between": between + hidden}, logged)
    assert extra == pytest.approx(0.2 - 0.001 - checks.BETWEEN_SLACK_MS, abs=1e-9)
    assert [ms for _, ms, _ in charged] == pytest.approx([0.02 + extra] * 4)


def test_calls_whose_cpu_time_ran_on_other_threads_are_threads():
    observed = {f"candidate/{i}": (0.001, 0.0005) for i in range(100)}  # 50 ms of CPU time in all
    assert checks.other_threads_worked(0.004, observed) is None  # a runtime thread's bookkeeping
    assert checks.other_threads_worked(0.025, observed).startswith("[threads] 25 ms of the 50 ms of CPU time")


def test_the_arena_carries_values_only_in_the_judges_layout():
    """The judge writes an input, the runner reads it there and writes an output into the judge's slot; what each
    reads is the shared memory's bytes. A value that is not a tensor has no slot."""
    judge_end, runner_end = mp.Pipe()
    arena = Arena.create([torch.zeros(4, 3), 7], [torch.zeros(5, dtype=torch.int64)], torch.device("cpu"))
    judge_end.send_bytes(json.dumps({"op": "arena", **arena.message}).encode())
    arena.send(judge_end)
    theirs = Arena.receive(runner_end, json.loads(runner_end.recv_bytes()))
    assert theirs.layout[1] == {} and theirs.inputs[1] is None and len(theirs.outputs) == 1
    arena.inputs[0].fill_(1.5)
    assert float(theirs.inputs[0].sum()) == 1.5 * 12
    theirs.outputs[0].copy_(torch.arange(5))
    assert torch.equal(arena.outputs[0], torch.arange(5))


def write_into_the_judges_slots(conn) -> None:
    """A runner's side of the arena, in a process of its own: the judge's input doubled into the output slot."""
    torch.cuda.set_device(0)
    theirs = Arena.receive(conn, json.loads(conn.recv_bytes()))
    conn.recv_bytes()  # the input is written
    theirs.outputs[0].copy_(theirs.inputs[0].sum(dim=1).long() * torch.arange(4, device="cuda"))
    torch.cuda.synchronize()
    conn.send_bytes(json.dumps({"on_device": theirs.outputs[0].is_cuda}).encode())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_arena_is_device_memory_that_another_process_writes_in_place():
    """The judge's block is device memory exported as a descriptor; a process that imports it writes the judge's
    own memory, and neither side's copy leaves the GPU."""
    judge_end, runner_end = mp.Pipe()
    device = torch.device("cuda", 0)
    arena = Arena.create([torch.zeros(4, 3, device=device), 7], [torch.zeros(4, dtype=torch.int64, device=device)],
                         device)
    assert arena.device == device and arena.inputs[0].is_cuda and arena.outputs[0].data_ptr() % 64 == 0
    runner = mp.get_context("spawn").Process(target=write_into_the_judges_slots, args=(runner_end,))
    runner.start()
    judge_end.send_bytes(json.dumps({"op": "arena", **arena.message}).encode())
    arena.send(judge_end)
    arena.inputs[0].fill_(2.0)
    torch.cuda.synchronize()
    judge_end.send_bytes(b"written")
    assert json.loads(judge_end.recv_bytes()) == {"on_device": True}
    runner.join(60)
    assert torch.equal(arena.outputs[0].cpu(), torch.arange(4) * 6)


def test_the_reference_is_timed_only_once_every_thread_of_the_runner_is_stopped():
    """A process whose two threads spin: after SIGSTOP, `wait_until_stopped` returns only when the kernel shows
    every thread stopped (a stop takes effect as each thread is next scheduled), and soon."""
    import signal
    import subprocess
    import sys

    spin = "import threading\ndef spin():\n    while True: pass\nthreading.Thread(target=spin).start()\nspin()"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        while len(os.listdir(f"/proc/{child.pid}/task")) < 2:
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGSTOP)
        began = time.perf_counter()
        jg.wait_until_stopped(child.pid)
        assert time.perf_counter() - began < 0.05
        states = [open(f"/proc/{child.pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0]
                  for t in os.listdir(f"/proc/{child.pid}/task")]
        assert states and all(s in "tT" for s in states), states
    finally:
        child.kill()
        child.wait()


def test_no_reported_call_is_paid_faster_than_the_judges_own_clock_allows():
    """The judge saw each reported call 1 ms longer than the harness alone took plus its reported time (work its
    events never saw): what is beyond the allowance is added to each call; an honest candidate, seen within the
    allowance, keeps its times."""
    reported = [(f"candidate/{i}", 0.1, 0.15) for i in range(0, 8, 2)]
    allowance = 0.02
    honest = {label: ((0.05 + ms + allowance / 2) / 1e3, 0.0) for label, ms, _ in reported}
    assert checks.judges_floor(reported, honest, harness_ms=0.05, allowance_ms=allowance)[0] == reported
    hidden = {label: ((0.05 + ms + 1.0) / 1e3, 0.0) for label, ms, _ in reported}
    floored, beyond = checks.judges_floor(reported, hidden, harness_ms=0.05, allowance_ms=allowance)
    assert beyond == pytest.approx(1.0)
    assert [ms for _, ms, _ in floored] == pytest.approx([0.1 + 1.0 - allowance] * 4)


def test_a_median_is_known_within_a_share_once_its_order_statistics_are_that_close():
    """Calls within 1% of each other settle a 1% precision from 5 calls on; one slow call in 10 does not unsettle
    them; calls spread by 10% do not settle it, however many; too few calls, or a median of 0, never do."""
    tight = [1.0 + 0.001 * (i % 7) for i in range(10)]
    assert checks.median_known_within(tight, 0.01)
    assert checks.median_known_within(tight[:9] + [5.0], 0.01)
    assert not checks.median_known_within([1.0 + 0.1 * (i % 5) for i in range(100)], 0.01)
    assert checks.median_known_within([1.0 + 0.1 * (i % 5) for i in range(100)], 0.2)
    assert not checks.median_known_within([1.0] * 4, 0.01)
    assert not checks.median_known_within([0.0] * 10, 0.01)


def test_the_floors_allowance_is_a_fraction_of_a_millisecond_and_a_share_of_the_call():
    """A short call may be seen beyond its reported time by the fixed allowance, a long one by a share of its
    median reported time more; no reported calls allow the fixed part alone."""
    short = [(f"candidate/{i}", 0.1, 0.15) for i in range(5)]
    assert checks.floor_allowance(short) == pytest.approx(checks.FLOOR_ALLOWANCE_MS + checks.FLOOR_SHARE * 0.1)
    long = [(f"candidate/{i}", ms, ms) for i, ms in enumerate([15.0, 15.0, 15.2, 14.8, 90.0])]
    assert checks.floor_allowance(long) == pytest.approx(checks.FLOOR_ALLOWANCE_MS + checks.FLOOR_SHARE * 15.0)
    assert checks.floor_allowance([]) == checks.FLOOR_ALLOWANCE_MS
    assert checks.FLOOR_ALLOWANCE_MS <= 0.5 and checks.FLOOR_SHARE <= 0.03


def test_moved_inputs_are_the_same_for_the_same_seed_and_leave_labels_and_indices_alone():
    torch.manual_seed(0)
    draw = [torch.randn(4096), torch.rand(4096), torch.randint(0, 2, (4096,)).float() * 2 - 1,
            torch.randint(0, 10, (4096,)), 3.0]
    first, again = jg.move([x.clone() if torch.is_tensor(x) else x for x in draw], 7), \
        jg.move([x.clone() if torch.is_tensor(x) else x for x in draw], 7)
    assert all(torch.equal(a, b) if torch.is_tensor(a) else a == b for a, b in zip(first, again))
    assert not torch.equal(first[0], draw[0]) and not torch.equal(first[1], draw[1])
    assert bool((first[1] >= 0).all())  # nowhere negative stays so: a shift up, never down
    assert torch.equal(first[2], draw[2]) and torch.equal(first[3], draw[3]) and first[4] == 3.0
    others = jg.move([x.clone() if torch.is_tensor(x) else x for x in draw], 8)
    assert not torch.equal(others[0], first[0])
