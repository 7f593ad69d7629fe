"""The judge: the process that decides a candidate's verdict, where no candidate code ever ran.

A candidate is code from a policy optimised to get paid; whatever shares its process, it can reach (a module
attribute replaced, a C function's method table swapped, the process's own memory rewritten through
/proc/self/mem). So the verdict is decided here, in a process that never imports candidate code, and the
candidate's process (the runner, runner.py) only runs it:

- the judge imports the task, builds the reference, and draws every input from its own unknowable random
  state; it writes a call's inputs into the memory it shares with the runner (tensor_exchange.py) just before
  it asks for the call, keeps the reference's outputs, and compares its own copies of the runner's, taken from
  that memory as each call returned, their slots cleared before, and its own copy of the inputs with what is
  left in their slots (a call that changed its inputs in place);
- it times the reference itself, with the runner stopped (SIGSTOP: no thread or signal handler of the
  candidate's runs meanwhile), and watches each candidate call from outside: the wall clock and the CPU time
  of the runner's process (the kernel's clock of it, which keeps what exited threads spent), from before the
  call's inputs are written to the answer that hands its outputs over. On the CPU that CPU time, less the
  harness's own, is the candidate's time; on a GPU the runner's own CUDA events are, accepted only where the
  judge's wall clock agrees within what the harness alone takes, measured on the same runner before the
  candidate was imported, and the GPU time of whatever the runner ran between its timed calls beyond the
  harness's own copies is added to them; and no call is paid as faster than the judge's own clock saw it take,
  less the harness alone's time and the host's noise around a call (`judges_floor`, `floor_allowance`); every
  other timed call runs under the runner's kernel log, which slows some kernels, and is checked, the others are
  reported, and their time may fall short of the logged calls' kernels by no more than the log costs an honest
  kernel;
- each request carries a number drawn here that its answer must echo: bytes the candidate writes on the
  socket are no answer.

What a candidate can still influence: by rewriting its own process's native code, the GPU times it reports
(by no more than `floor_allowance` below what the judge's clock saw) and the kernel list its profiler records (the
own-kernel share); by telling the logged calls from the reported ones, its time by up to the log's cost; the judge
decides everything else.

This file is the process: the requests to the runner, the draws of inputs, the reference, the clocks read from
outside, the memory. What it gathers is checked in judge_checks.py, pure functions tested on numbers made by hand,
beside the slacks they allow (the floor's allowance, the log's cost).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import select
import signal
import time

import torch

from kevin.harness import (flatten_outputs, flush_buffer, identical, make_timer, peak_resident_bytes, start_task,
                           wait_awake)
from kevin.judge_checks import (charge_between_calls, clock_mismatch, compare, floor_allowance, judges_floor,
                                log_dodging, median, median_known_within, other_threads_worked, own_kernel_share,
                                repeat_disagrees, slowed_reference, unobserved_time)
from kevin.tensor_exchange import Arena

# Clean calls of the harness alone, before the candidate is imported: what a timed call costs with no model.
NULL_CALLS = 20
# Timed trials before timing may stop (its budget spent, or every median known to within `timing_precision`).
MIN_TIMING_TRIALS = 10
# How long the judge waits for a killed runner to exit (its CUDA context released) before timing the reference alone.
RUNNER_EXIT_S = 10.0
# GPU memory, in multiples of the task's footprint (the reference's parameters, one draw of inputs, its outputs and
# working memory at its peak): the judge's allocations stay within JUDGE_MEMORY of it (one draw, its own copy of
# the reference's outputs and of the candidate's; beside them the shared block of one draw's inputs and outputs and
# the 512 MB flush), and the candidate's process may allocate RUNNER_MEMORY of it plus RUNNER_SPARE bytes (beside
# the shared block, which the judge made). A candidate is judged only once the GPU has the judge's share and one
# footprint free (the spare is a ceiling, not a claim: a small task beside an engine that holds most of the GPU
# still runs); the judge waits up to ADMISSION_WAIT_S for processes that are exiting to give theirs back.
JUDGE_MEMORY, RUNNER_MEMORY, RUNNER_SPARE = 2, 1, 1 << 30
ADMISSION_WAIT_S = 60.0


def clone(inputs: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def changed(before: list, after: list) -> bool:
    return any(isinstance(b, torch.Tensor) and not identical(b, a) for b, a in zip(before, after))


def tensor_bytes(values: list) -> int:
    return sum(v.nbytes for v in values if isinstance(v, torch.Tensor))


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def make_inputs(task, device: torch.device, seed: int) -> list:
    """The task's inputs for `seed`, made on the device where the task does not say otherwise (a gigabyte of random
    numbers takes seconds on the host and milliseconds on a GPU)."""
    torch.manual_seed(seed)
    random.seed(seed)
    with device:
        inputs = task.get_inputs()
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]


def move(inputs: list, seed: int) -> list:
    """`inputs`, each floating tensor among them scaled and shifted in place by numbers drawn from `seed` (scale
    log-uniform in [0.5, 2], shift uniform in [-1, 1], or [0, 1] where it is nowhere negative): where a task's output
    barely moves across the draws of its get_inputs (a mean over a million elements), an output that ignores its
    inputs (the expected value, written by a kernel) would pass every draw; on moved draws it is wrong. Tensors of
    two values or fewer (labels of ±1, masks) are left as they are, and so are integer ones (indices)."""
    draw = random.Random(seed)
    for x in inputs:
        scale, shift = math.exp(draw.uniform(-math.log(2), math.log(2))), draw.uniform(-1.0, 1.0)
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() and \
                x.reshape(-1)[:1024].unique().numel() > 2:
            x.mul_(scale).add_(abs(shift) if bool(x.min() >= 0) else shift)
    return inputs


def non_finite(outputs: list) -> int:
    return sum(int((~torch.isfinite(o)).sum()) for o in outputs if isinstance(o, torch.Tensor)
               and o.is_floating_point())


class RunnerGone(Exception):
    """The runner closed its socket: it crashed, was killed, or exited; the evaluator has its exit status."""


class ForgedAnswer(Exception):
    """Something other than the runner's answer to the judge's last request came on their socket."""


class NoRoom(Exception):
    """The task does not fit on this device beside the candidate's process, or not in what is free there."""


def wait_until_stopped(pid: int, limit_s: float = 0.05) -> None:
    """Until every thread of process `pid` is stopped (or gone), for `limit_s` at most."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
            states = [open(f"/proc/{pid}/task/{t}/stat").read().rsplit(")", 1)[1].split()[0] for t in tasks]
        except (OSError, IndexError):
            return
        if all(state in "tTZX" for state in states):
            return


def runner_cpu_s(pid: int) -> tuple[float, float]:
    """(CPU seconds of process `pid`, of its main thread), to the nanosecond: the kernel's CPU clock of the
    process, which keeps what its exited threads spent (a thread started, worked and joined inside a call
    counts), and the main thread's schedstat; exact for a process that is waiting, as a runner between
    requests is."""
    try:
        process = time.clock_gettime_ns(~pid << 3 | 2) / 1e9  # the clock id of `pid`'s CPU time (all threads)
        with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
            return process, int(f.read().split()[0]) / 1e9
    except OSError as e:  # the process is gone
        raise RunnerGone from e


class Judge:
    """One candidate's verdict, asked of the runner whose socket is `runner` and whose process is `runner_pid`."""

    def __init__(self, payload: dict, runner):
        self.payload, self.runner, self.defend = payload, runner, payload["defences"]
        self.awake = payload.get("spin_waits", False)  # on a core of its own: timed calls waited for awake
        self.device, self.task, init_inputs = start_task(payload)
        self.cuda = self.device.type == "cuda"
        torch.manual_seed(payload["seed"])
        self.reference = self.task.Model(*init_inputs).to(self.device).eval()
        self.unknowable = random.Random(os.urandom(16))  # every draw of inputs, order and spot check
        self.flush = flush_buffer(self.device)
        # the reference is timed with no kernel log: it runs no candidate code, and a profiler in this process added
        # 0 to 27% to its calls (per aten op and launch, the most to references of several ops), where the clean
        # timing of bench/timing_fidelity.py agrees with the candidate's calls timed under the runner's log
        self.timer = make_timer(self.cuda, self.flush, None)
        self.times: dict[str, float] = {}
        self.arena: Arena | None = None
        self.other_threads_s = 0.0  # CPU time of the runner's threads but its main one, in timed calls
        self.logged: set[str] = set()  # the labels of the candidate's timed calls made under the kernel log
        self.reference_changes_inputs = True  # until the first draw shows otherwise: its inputs cloned for it
        self.moved = False  # whether every draw of inputs is moved (`move`): decided on the first draw
        self.memory: dict[str, int] = {}  # bytes: the task's footprint, the runner's limit and peak

    # ------------------------------------------------------------------------------------------ the runner

    def ask(self, message: dict, then=None, awake: bool = False) -> dict:
        """The runner's answer to `message` (`then` run once it is sent; waited for `awake`: `wait_awake`), which
        must echo the request's number, drawn here: bytes the candidate writes on every socket it finds are no
        answer (`ForgedAnswer`)."""
        number = self.unknowable.randrange(2**62)
        try:
            self.runner.send_bytes(json.dumps({**message, "number": number}).encode())
            if then:
                then()
            if awake:
                wait_awake(self.runner)
            return self.answer(number)
        except (EOFError, OSError) as e:
            raise RunnerGone from e

    def answer(self, number: int) -> dict:
        try:
            answer = json.loads(self.runner.recv_bytes())
        except ValueError as e:
            raise ForgedAnswer from e
        if not isinstance(answer, dict) or answer.get("number") != number:
            raise ForgedAnswer
        return answer

    def make_inputs(self, seed: int) -> list:
        inputs = make_inputs(self.task, self.device, seed)
        return move(inputs, seed) if self.moved else inputs

    def outputs(self, described: list) -> list[dict]:
        """The runner's outputs as described, each tensor that fits its slot copied out of it now (the judge's own
        copy, taken as the call returned: a buffer the candidate keeps cannot change it later)."""
        taken = []
        for i, d in enumerate(described if isinstance(described, list) else []):
            d = dict(d) if isinstance(d, dict) else {"type": type(d).__name__}
            slot = self.arena.outputs[i] if i < len(self.arena.outputs) else None
            if "shape" in d and slot is not None and d["shape"] == list(slot.shape) and \
                    d.get("dtype") == str(slot.dtype).removeprefix("torch."):
                d["value"] = slot.clone()
            elif "shape" in d and "dtype" not in d:
                d = {"type": "a malformed description"}
            taken.append(d)
        if self.cuda:  # the copies taken before the runner may write again
            torch.cuda.synchronize()
        return taken

    @contextlib.contextmanager
    def runner_stopped(self):
        """The runner's whole process group stopped (SIGSTOP cannot be caught): nothing of the candidate's runs on
        a core while the reference is timed, no thread, no signal handler. A stop takes effect as each thread is
        next scheduled: the timing starts once every thread of the runner is seen stopped (a stop still under way
        slowed some references' timed calls by up to 6% on the H200)."""
        if not self.defend:
            yield
            return
        os.killpg(self.payload["runner_pid"], signal.SIGSTOP)
        try:
            wait_until_stopped(self.payload["runner_pid"])
            yield
        finally:
            os.killpg(self.payload["runner_pid"], signal.SIGCONT)

    def failed(self, answer: dict) -> dict | None:
        """The verdict an answer carries by itself: the candidate raised, or the runner refused an output."""
        if "error" in answer:
            return {"stage": answer.get("stage", "candidate"), "error": str(answer["error"]),
                    "traceback": str(answer.get("traceback", ""))}
        if "rejected" in answer:
            return self.rejected(str(answer["rejected"]))
        return None

    def rejected(self, rule_and_why: str) -> dict:
        return {"rejected": rule_and_why, "times": self.times}

    # ------------------------------------------------------------------------------------------ the verdict

    def verdict(self) -> dict:
        """Clean measurements first (the harness alone, the reference alone), then the candidate imported,
        checked on fresh inputs and timed beside the reference."""
        start = time.perf_counter()
        seed = self.unknowable.randrange(2**31)
        inputs = self.first_draw(seed)
        limit = self.admit()
        if failed := self.failed(self.ask({"op": "arena", **self.arena.message, "memory_limit": limit},
                                          then=lambda: self.arena.send(self.runner))):
            return failed
        harness, clean = self.before_the_candidate(inputs)
        del inputs  # drawn again from its seed where needed: the judge holds one draw at a time
        if failed := self.failed(self.ask({"op": "import"})):
            return failed
        self.times["load"] = time.perf_counter() - start

        start = time.perf_counter()
        failed, worst, worst_rel = self.check_correctness()
        if failed:
            return failed
        self.times["correctness"] = time.perf_counter() - start

        start = time.perf_counter()
        failed, calls, observed = self.time_models(harness["cpu"])
        if failed:
            return failed
        self.times["timing"] = time.perf_counter() - start
        start = time.perf_counter()
        report = self.ask({"op": "finish"})
        self.times["profile"] = time.perf_counter() - start
        self.memory["candidate"] = int(report.get("peak_memory") or 0)
        windows, opened = report.get("windows") or {}, report.get("opened") or {}
        if self.defend and report.get("tamper"):
            return self.rejected(str(report["tamper"]))
        share, between_ms, unreported_ms, allowance_ms = None, 0.0, None, None
        candidate = calls["candidate"]
        if self.defend and self.cuda:  # the logged calls are checked, the others' times reported
            logged = [row for row in candidate if row[0] in self.logged]
            candidate = [row for row in candidate if row[0] not in self.logged]
            if mismatch := clock_mismatch(logged, windows, opened):
                return self.rejected(mismatch)
            if self.payload["min_own_kernel_share"] > 0:
                why, share = own_kernel_share(windows, self.payload["kernel_names"],
                                              self.payload["min_own_kernel_share"], self.payload["max_copy_share"])
                if why:
                    return self.rejected(why)
            if why := log_dodging(logged, candidate, windows):
                return self.rejected(why)
            candidate, between_ms = charge_between_calls(candidate, report, self.logged)
            why = unobserved_time(candidate + logged, observed, harness["wall"]) or \
                self.slowed_reference(calls, clean, seed)
            if why:
                return self.rejected(why)
            allowance_ms = floor_allowance(candidate)
            candidate, unreported_ms = judges_floor(candidate, observed, harness["seen"], allowance_ms)
        medians = {name: median([ms for _, ms, _ in rows]) for name, rows in {**calls, "candidate": candidate}.items()
                   if name != "timer"}
        return {"medians": medians, "trials": len(calls["candidate"]), "max_abs_diff": worst, "max_rel_diff": worst_rel,
                "times": self.times, "own_kernel_share": share, "between_calls_ms": between_ms,
                "unreported_ms": unreported_ms, "floor_allowance_ms": allowance_ms}

    def slowed_reference(self, calls: dict, clean: dict, seed: int) -> str | None:
        """`slowed_reference` against the reference timed before the candidate was imported, and where that finds
        it slower, against the reference timed again once the runner is gone (killed, its CUDA context and any
        work it left on the GPU with it): the candidate did it only if the reference is fast again without it.
        Whatever else slowed it (a loaded host, other processes on the GPU) slows that control as well."""
        limit = self.payload["max_reference_slowdown"]
        if not slowed_reference(calls, clean, limit):
            return None
        os.killpg(self.payload["runner_pid"], signal.SIGKILL)
        with contextlib.suppress(OSError):
            gone = os.pidfd_open(self.payload["runner_pid"])
            select.select([gone], [], [], RUNNER_EXIT_S)  # readable once the process has exited
            os.close(gone)
        inputs = self.make_inputs(seed)
        alone = [self.timer(self.reference, self.reference_args(inputs), "clean")[0] for _ in range(NULL_CALLS)]
        return slowed_reference(calls, {**clean, "reference": min(alone[self.payload["warmup"]:] or alone)}, limit)

    # ------------------------------------------------------------------------------------------ memory

    def first_draw(self, seed: int) -> list:
        """The first draw of inputs, on which the reference's outputs size the shared block (made here) and its
        peak the task's footprint; whether the reference changes its inputs in place (else they are not cloned for
        it). Where it does not fit, once processes that are exiting have given their memory back, `NoRoom`."""
        for attempt in range(2):
            try:
                return self.measure_first_draw(seed)
            except torch.OutOfMemoryError:
                if not self.cuda:
                    raise NoRoom("the task's inputs and its reference's outputs do not fit in host memory") from None
            torch.cuda.empty_cache()  # what the failed attempt held went with its frame
            if attempt:
                free, total = torch.cuda.mem_get_info(self.device)
                raise NoRoom(f"the task's inputs and its reference's outputs do not fit in the {free / 2**30:.1f} "
                             f"GiB free of {total / 2**30:.1f} GiB on {self.device}")
            self.wait_while_memory_is_freed()

    def measure_first_draw(self, seed: int) -> list:
        """first_draw's work; the footprint from the allocator's peak on a GPU, the resident peak on the CPU."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
        else:
            before = resident_bytes()
        inputs = self.make_inputs(seed)
        ref_args = clone(inputs)
        outputs = flatten_outputs(self.reference(*ref_args))
        self.reference_changes_inputs = changed(inputs, ref_args)
        peak = torch.cuda.max_memory_allocated(self.device) if self.cuda else peak_resident_bytes()
        peak = max(peak - before - tensor_bytes(ref_args), tensor_bytes(inputs) + tensor_bytes(outputs))
        self.memory["footprint"] = peak + tensor_bytes([*self.reference.parameters(), *self.reference.buffers()])
        shapes = [o.to("meta") if isinstance(o, torch.Tensor) else o for o in outputs]
        bad = non_finite(outputs)
        del ref_args, outputs
        if self.defend:
            del inputs  # one draw at a time
            inputs = self.moved_if_the_task_allows(seed, bad)
        if self.cuda:  # the block is the driver's memory, not the allocator's: what it keeps cached goes back first
            torch.cuda.empty_cache()
        self.arena = Arena.create(inputs, shapes, self.device)
        return inputs

    def moved_if_the_task_allows(self, seed: int, non_finite_outputs: int) -> list:
        """The first draw moved (`move`), and every later one from now on, where the reference takes moved inputs as
        it takes the task's own (no error, no more non-finite outputs: a task whose inputs must be a valid
        probability or lie in [-1, 1] keeps its own); else the task's own first draw."""
        self.moved = True
        inputs = self.make_inputs(seed)
        try:
            self.moved = non_finite(flatten_outputs(self.reference(*clone(inputs)))) <= non_finite_outputs
        except Exception:
            self.moved = False
        return inputs if self.moved else self.make_inputs(seed)

    def admit(self) -> int | None:
        """The bytes the runner may allocate (None on the CPU), once the GPU has them free beside what the judge's
        checks will take; a task whose candidate cannot fit on this GPU at all is `NoRoom`."""
        if not self.cuda:
            return None
        footprint = self.memory["footprint"]
        limit = self.memory["candidate_limit"] = RUNNER_MEMORY * footprint + RUNNER_SPARE
        held = torch.cuda.memory_reserved(self.device)
        need = max(0, JUDGE_MEMORY * footprint - held) + RUNNER_MEMORY * footprint  # the cap's spare is no claim
        total = torch.cuda.mem_get_info(self.device)[1]
        if held + need + self.arena.nbytes > total:
            raise NoRoom(f"the task needs about {(held + need + self.arena.nbytes) / 2**30:.1f} GiB of GPU memory "
                         f"({JUDGE_MEMORY} + {RUNNER_MEMORY} times its footprint of {footprint / 2**30:.2f} GiB and "
                         f"the shared block of {self.arena.nbytes / 2**30:.2f} GiB) and {self.device} has "
                         f"{total / 2**30:.1f} GiB")
        if not self.wait_for_memory(lambda free: free >= need):
            raise NoRoom(f"{self.device} had less than the {need / 2**30:.1f} GiB free that the task needs for "
                         f"{ADMISSION_WAIT_S:.0f} s: other processes hold the rest")
        return limit

    def wait_while_memory_is_freed(self) -> None:
        """Until the device's free memory has not grown for a second (processes exiting give theirs back)."""
        deadline, most, since = time.monotonic() + ADMISSION_WAIT_S, 0, time.monotonic()
        while time.monotonic() < min(deadline, since + 1.0):
            if (free := torch.cuda.mem_get_info(self.device)[0]) > most + (64 << 20):
                most, since = free, time.monotonic()
            time.sleep(0.05)

    def wait_for_memory(self, enough) -> bool:
        """Whether `enough(free bytes on the device)` came true within ADMISSION_WAIT_S."""
        deadline = time.monotonic() + ADMISSION_WAIT_S
        while not enough(torch.cuda.mem_get_info(self.device)[0]):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def memory_report(self) -> dict[str, float]:
        """MiB: the task's footprint, the judge's peak (its allocator's and the shared block; on the CPU its
        resident peak), the candidate's process's peak and limit (as far as they are known)."""
        if self.cuda:
            judge = torch.cuda.max_memory_reserved(self.device) + (self.arena.nbytes if self.arena else 0)
        else:
            judge = peak_resident_bytes()
        return {name: round(value / 2**20, 1) for name, value in {**self.memory, "judge": judge}.items() if value}

    def reference_args(self, inputs: list) -> list:
        """The reference's arguments: `inputs` themselves, or a copy where the reference changes its inputs."""
        return clone(inputs) if self.reference_changes_inputs else inputs

    def one_element(self) -> torch.Tensor:
        """The least a model can do on the GPU: one kernel on one element (the latency a loaded host adds)."""
        return self.flush[:1].zero_()

    def before_the_candidate(self, inputs: list) -> tuple[dict, dict[str, float]]:
        """Clean measurements, taken before the candidate is imported so that it has no part in them, and as the
        timing will call (each call of the runner after the reference has run with the runner stopped):
        - what a timed call of the runner costs with no model at all, as the judge sees it: the least wall time
          beyond the runner's report, and the least CPU time of the runner's threads, from before the inputs are
          written to the answer that hands the outputs over (the least, not the median: a 0.1 ms CPU kernel less a
          noisy harness's median once came out at no time at all, paid as the fastest possible; less the cheapest
          call, it can only read slower), and on a GPU the median wall time of the calls made with the kernel log
          off, as the reported calls are made (`seen`), which the judge's floor starts from;
        - on a GPU, the reference's fastest call and the fastest of the judge's own one-element kernel, which
          `slowed_reference` compares with (on the CPU the runner is stopped while the reference runs, so nothing
          of the candidate's can slow it there)."""
        walls, cpus, unlogged, clean = [], [], [], {"reference": [], "timer": []}
        for i in range(NULL_CALLS if self.defend else 0):
            with self.runner_stopped():
                clean["reference"].append(self.timer(self.reference, self.reference_args(inputs), "clean")[0])
                if self.cuda:
                    clean["timer"].append(self.timer(lambda *_: self.one_element(), [], "clean")[0])
            logged = not self.cuda or i % 2 == 0  # as the candidate's calls will alternate
            wall_s, cpu_s, answer = self.timed_call(f"null/{i}", inputs, logged, null=True)
            if failed := self.failed(answer):
                raise RunnerGone(str(failed))
            walls.append(wall_s * 1e3 - float(answer.get("events", math.nan)))
            cpus.append(cpu_s * 1e3)
            if logged:
                self.logged.add(f"null/{i}")
            else:
                unlogged.append(wall_s * 1e3)
        harness = {"wall": min(walls, default=0.0), "cpu": min(cpus, default=0.0),
                   "seen": median(unlogged) if unlogged else 0.0}
        warm = self.payload["warmup"]  # the first calls, as the timing's warm-ups, are left out where more follow
        return harness, {name: min(ms[warm:] or ms) for name, ms in clean.items()} if self.cuda and walls else {}

    def timed_call(self, label: str, inputs: list, logged: bool = True, null: bool = False
                   ) -> tuple[float, float, dict]:
        """(wall and CPU seconds, the answers) of a call on `inputs` (`null`: of no model, on them all the same):
        both clocks run from before the inputs are written into their slots to the answer that hands the outputs
        over, the wall clock here and the CPU clock of the runner's process; the runner waits on its socket before
        and after, so that both are exact, and whatever it does once its inputs are there, put off until its
        outputs are handed over included, is inside them. Every call's outputs are handed over alike, into cleared
        slots; which of them the judge reads, the runner never learns. Unless `logged`, the kernel log's GPU side
        is off from before the call to its outputs handed over (asked outside the clocks)."""
        if not logged and (failed := self.failed(self.ask({"op": "log", "on": False}))):
            return 0.0, 0.0, failed
        wall_s, cpu_s, answer = self.clocked_call(label, inputs, null)
        if not logged and not self.failed(answer):
            answer = {**answer, **self.ask({"op": "log", "on": True})}
        return wall_s, cpu_s, answer

    def clocked_call(self, label: str, inputs: list, null: bool) -> tuple[float, float, dict]:
        pid = self.payload["runner_pid"]
        process, main = runner_cpu_s(pid)
        began = time.perf_counter()
        message = {"op": "go", "label": label, "null": null, **self.put_inputs(inputs)}
        self.clear_slots()
        answer = self.ask(message, awake=self.awake)
        wall_s = time.perf_counter() - began
        process_after, main_after = runner_cpu_s(pid)
        self.other_threads_s += (process_after - process) - (main_after - main)
        return wall_s, process_after - process, answer

    def put_inputs(self, inputs: list) -> dict:
        """`inputs` written into their slots, and the part of the request that carries the rest (the values of
        inputs that are not tensors). On a GPU the writes are ordered before the runner's reads by the synchronize
        of `clear_slots`, which every caller runs next."""
        values = []
        for slot, value in zip(self.arena.inputs, inputs):
            if slot is None:
                values.append(value)
            elif list(value.shape) != list(slot.shape) or value.dtype != slot.dtype:
                raise ValueError(f"the task's get_inputs() made a {list(value.shape)} {value.dtype} input where its "
                                 f"first draw made a {list(slot.shape)} {slot.dtype} one: every draw must agree")
            else:
                slot.copy_(value)
                values.append(None)
        return {"values": values}

    def clear_slots(self) -> None:
        """Every byte of the output slots set to 0xFF (NaN in any float dtype) before a call: what the runner does
        not write this call cannot pass for its answer."""
        for slot in self.arena.outputs:
            if slot is not None and slot.numel():
                slot.view(-1).view(torch.uint8).fill_(0xFF)
        if self.cuda:  # the inputs written and the slots cleared before the runner reads or writes: no order
            torch.cuda.synchronize()  # holds between two processes' streams

    # ------------------------------------------------------------------------------------------ correctness

    def call(self, inputs: list, **options) -> tuple[dict | None, list[dict], bool]:
        """(the failure or None, the outputs, whether the call changed its inputs) of one checked call of the
        candidate on `inputs`."""
        message = {"op": "call", **self.put_inputs(inputs), **options}
        self.clear_slots()
        answer = self.ask(message)
        if failed := self.failed(answer):
            return failed, [], False
        if answer.get("unsynchronized"):
            why = ("[unsynchronized-stream] the output was still being written when forward returned: synchronise "
                   "side streams with the current stream before returning")
            return self.rejected(why), [], False
        return None, self.outputs(answer.get("outputs")), changed(inputs, self.arena.inputs)

    def check_correctness(self) -> tuple[dict | None, float, float]:
        """(the failed result or None, the largest absolute and relative differences seen) over `correct_trials`
        draws of inputs no one knows in advance: the candidate into poisoned memory, the reference here on its own
        copy; on the first draw `repeat_runs` more times, the last beside a busy kernel, each agreeing with the
        first run far tighter than with the reference (a race inside the tolerance still lands differently)."""
        payload, worst, worst_rel = self.payload, 0.0, 0.0
        self.trial_seeds = []
        for trial in range(payload["correct_trials"]):
            self.trial_seeds.append(seed := self.unknowable.randrange(2**31))
            inputs = out = expected = ref_args = None  # the last trial's freed before this one's are made
            inputs = self.make_inputs(seed)
            began = time.perf_counter()
            failed, out, changed_inputs = self.call(inputs)
            first_ms = (time.perf_counter() - began) * 1e3
            if failed:
                return failed, worst, worst_rel
            repeats = payload["repeat_runs"] if trial == 0 and self.defend else 0
            for repeat in range(1, repeats + 1):
                failed, again, _ = self.call(inputs, beside_ms=first_ms if repeat == repeats else 0.0)
                if failed:
                    return failed, worst, worst_rel
                if why := repeat_disagrees(out, again, payload["repeat_tolerance"]):
                    return self.rejected(f"[nondeterministic] run {repeat + 1} on the same inputs {why}: a race (a "
                                         "missing __syncthreads()?) or memory read before it is written"), \
                        worst, worst_rel
                del again  # one repeat's outputs at a time
            ref_args = self.reference_args(inputs)
            expected = self.reference(*ref_args)
            status, why, diff, rel = compare(out, expected, payload["tolerance"])
            worst, worst_rel = max(worst, diff), max(worst_rel, rel)
            if status == "rejected":
                return self.rejected(why), worst, worst_rel
            if status:
                failed = {"incorrect": f"trial {trial + 1} of {payload['correct_trials']}: {why}",
                          "max_abs_diff": diff, "max_rel_diff": rel, "times": self.times}
                if not payload["copy_parameters"]:
                    failed["weights_differ"] = self.passes_with_reference_parameters(inputs, expected)
                return failed, worst, worst_rel
            if self.defend and changed_inputs and not changed(inputs, ref_args):
                return self.rejected("[modifies-inputs] the candidate changed its input tensors in place"), \
                    worst, worst_rel
        return None, worst, worst_rel

    def passes(self, inputs: list, expected) -> bool:
        """Whether the candidate, run as the correctness trials run it, matches `expected` on `inputs`."""
        failed, out, _ = self.call(inputs)
        return not failed and compare(out, expected, self.payload["tolerance"])[0] is None

    def passes_with_reference_parameters(self, inputs: list, expected) -> bool:
        """Whether the failing trial passes once the reference's parameters are copied into the candidate: then
        its kernel is right and its weights are not (made with other init calls, or in another order)."""
        answer = self.ask({"op": "copy_parameters"})
        return bool(answer.get("copied")) and self.passes(inputs, expected)

    # ------------------------------------------------------------------------------------------ timing

    def time_models(self, harness_cpu_ms: float) -> tuple[dict | None, dict, dict]:
        """(the rejection or None, each model's timed calls as (label, ms, wall ms), the judge's observation of each
        candidate call by label as (wall seconds, CPU seconds of the runner's threads)): warm-up, then the models in
        a random order each trial on an independent draw of inputs (written where the runner reads them only as its
        call is asked for), so that clock drift hits them alike, until the medians are known well enough (`settled`)
        or the budget is spent; random timed outputs are compared with the reference's on the same inputs. The
        reference runs here with the runner stopped. On a GPU a candidate's call
        takes the time the runner reports (its events, checked against what is seen from here in
        `unobserved_time`); on the CPU it takes the CPU time the kernel counted for the runner's process, less the
        harness's own (`harness_alone`), and the reference the CPU time of this thread: nothing the candidate's
        process says of itself, and what other work on the machine takes from the wall clock does not count."""
        payload, models = self.payload, self.models_to_time()
        harness_ms, inputs, observed = [harness_cpu_ms], None, {}
        calls = {name: [] for name in models}
        draws, deadline = self.unknowable.randrange(2**31), None
        self.other_threads_s = 0.0
        # on a GPU with the defences on, at least one timed call under the kernel log and one reported (below)
        trials = max(payload["timing_trials"], 2 if self.cuda and self.defend else 1)
        for trial in range(-payload["warmup"], trials):
            if trial == 0:
                deadline = time.perf_counter() + payload["timing_budget_s"]
            outputs = {}  # the last trial's freed before this one's inputs are made
            if self.defend and not self.cuda and inputs is not None and (failed := self.harness_alone(trial, inputs,
                                                                                                      harness_ms)):
                return failed, calls, observed
            if self.defend or trial == -payload["warmup"]:
                seed, inputs = draws + trial, None
                inputs = self.make_inputs(seed)
            # every one of the first trials, which may be all there are: a candidate wrong on a share of its calls
            # is caught as surely as the median of its calls is paid
            checked = self.defend and (trial < MIN_TIMING_TRIALS or trial == trials - 1
                                       or self.unknowable.random() < 0.25)
            # the logged calls are the ones the checks read, the others' times the reported ones
            logged = not (self.cuda and self.defend) or trial < 0 or trial % 2 == 1
            for name in self.unknowable.sample(list(models), len(models)) if self.defend else list(models):
                label = f"{name}/{trial}"
                if name == "candidate":
                    wall_s, cpu_s, answer = self.timed_call(label, inputs, logged)
                    if logged:
                        self.logged.add(label)
                    if failed := self.failed(answer):
                        return failed, calls, observed
                    observed[label] = (wall_s, cpu_s)
                    events, wall = float(answer.get("events", math.nan)), float(answer.get("wall", math.nan))
                    if not self.cuda:
                        events = cpu_s * 1e3  # the harness's share taken off below, once it is known
                    if checked:
                        outputs[name] = self.outputs(answer.get("outputs"))
                else:
                    args = [] if name == "timer" else self.reference_args(inputs) if self.defend else inputs
                    with self.runner_stopped():
                        cpu = time.thread_time()
                        events, wall, outputs[name] = self.timer(models[name], args, label)
                        cpu = time.thread_time() - cpu
                    if not self.cuda:
                        events = cpu * 1e3
                if trial >= 0 and not math.isnan(events):
                    calls[name].append((label, events, wall))
            if checked and compare(outputs["candidate"], outputs["reference"], payload["tolerance"])[0]:
                return self.timed_output_wrong(seed, outputs["reference"], trial + payload["warmup"] + 1), \
                    calls, observed
            if trial + 1 >= MIN_TIMING_TRIALS and (time.perf_counter() > deadline or self.settled(calls, harness_ms)):
                break
        if not self.cuda:
            calls["candidate"] = less_the_harness(calls["candidate"], harness_ms)
        if self.defend and not self.cuda and (why := other_threads_worked(self.other_threads_s, observed)):
            return self.rejected(why), calls, observed
        return None, calls, observed

    def settled(self, calls: dict, harness_ms: list[float]) -> bool:
        """Whether every median the speedup is made of is known to within `timing_precision` (`median_known_within`):
        the reference's (and the compiled one's), and the candidate's as it will be paid: on a GPU with the defences
        on, its reported calls; on the CPU, less the harness alone."""
        if not self.payload["timing_precision"]:
            return False
        paid = {name: [ms for _, ms, _ in rows] for name, rows in calls.items() if name != "timer"}
        if self.cuda and self.defend:
            paid["candidate"] = [ms for label, ms, _ in calls["candidate"] if label not in self.logged]
        elif not self.cuda:
            paid["candidate"] = [ms for _, ms, _ in less_the_harness(calls["candidate"], harness_ms)]
        return all(median_known_within(ms, self.payload["timing_precision"]) for ms in paid.values())

    def models_to_time(self) -> dict:
        """The models timed side by side, by name (the candidate's calls are the runner's): the reference, torch.compile
        of it where asked, and on a GPU with the defences on the judge's own one-element kernel (the host's load)."""
        models = {"candidate": None, "reference": self.reference}
        if self.payload["compile_baseline"]:
            compiled = torch.compile(self.reference)
            compiled(*self.make_inputs(self.payload["seed"]))
            models["compiled"] = compiled
        if self.cuda and self.defend:
            models["timer"] = lambda *_: self.one_element()
        return models

    def harness_alone(self, trial: int, inputs: list, harness_ms: list[float]) -> dict | None:
        """On the CPU, a call of no model in every trial, on the last trial's inputs (this trial's are not the
        runner's to see early), its CPU time added to `harness_ms`, whose least is taken off the candidate's calls:
        measured under the load those calls saw, it cannot exceed theirs as the load eases (a harness measured only
        before the import, on a busy host, once read an honest 0.1 ms ReLU as 273x), and whatever the candidate's
        code does to these calls can only lower it."""
        _, cpu_s, answer = self.timed_call(f"harness/{trial}", inputs, null=True)
        harness_ms.append(cpu_s * 1e3)
        return self.failed(answer)

    def timed_output_wrong(self, seed: int, expected, call: int) -> dict:
        """What a wrong timed output says, asked of the candidate again outside the timer, as the correctness
        trials ask it: right now on that input, it was wrong only while timed; wrong now on the first correctness
        input, which it got right before, it changed; wrong on that input alone, it is merely wrong there (an
        honest kernel at the edge of the tolerance, on an input the trials did not draw): `incorrect`. `call`
        counts the timed calls from the first warm-up, 1-based."""
        rule = f"[changed-during-timing] timed call {call} returned a wrong result "
        failed, again, _ = self.call(self.make_inputs(seed))
        if failed:
            return failed
        status, why, diff, rel = compare(again, expected, self.payload["tolerance"])
        if status is None:
            return self.rejected(rule + "that it gets right outside the timer")
        first = self.make_inputs(self.trial_seeds[0])
        if not self.passes(first, self.reference(*clone(first))):
            return self.rejected(rule + "and now gets the first correctness trial wrong too")
        if status == "rejected":
            return self.rejected(why)
        return {"incorrect": f"timed call {call}, on inputs the correctness trials did not draw: {why}",
                "max_abs_diff": diff, "max_rel_diff": rel, "times": self.times}


def less_the_harness(rows: list, harness_ms: list[float]) -> list:
    """A CPU candidate's timed calls as they are paid: each less the cheapest call of the harness alone
    (`Judge.harness_alone`), and never below nothing."""
    return [(label, max(0.0, ms - min(harness_ms)), wall) for label, ms, wall in rows]


def judge(payload: dict, runner) -> dict:
    """The judge child's job: the verdict, or that the runner is gone (its exit status then says why)."""
    try:
        with torch.no_grad():  # the reference runs as it is timed everywhere: without autograd
            judged = Judge(payload, runner)
            return {**judged.verdict(), "memory_mib": judged.memory_report()}
    except NoRoom as e:
        return {"no_room": str(e)}
    except RunnerGone:
        return {"runner_gone": True}
    except ForgedAnswer:
        return {"rejected": "[forged-answer] the judge's socket carried bytes that were not the answer to its request "
                            "(written there by the candidate's code)", "times": {}}
