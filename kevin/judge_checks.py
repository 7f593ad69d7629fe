"""The judge's checks (judge.py): pure functions of what the judge saw and what the runner reported, each saying why
a verdict cannot stand, or how much longer than reported a candidate's calls took. No process, socket or clock is
read here, so each check is tested on numbers made by hand (tests/test_judge.py).

- the outputs: `compare` with the reference (shape, dtype, NaN/Inf where the reference is finite, allclose, and an
  error of the order of the reference's own magnitude, which no tolerance excuses), in float64 chunks of bounded
  memory; `repeat_disagrees`, a run on the same inputs against the first, far tighter than the tolerance;
- the clocks: the runner's CUDA events against its own wall clock and the kernels its log saw (`clock_mismatch`),
  against the judge's wall clock around each call (`unobserved_time`, and `judges_floor`, which raises each
  reported call to what that clock allows), and on the CPU the CPU time of threads other than forward's caller
  (`other_threads_worked`);
- the kernel log: the candidate's own kernels' share of its GPU time (`own_kernel_share`), the reported calls held
  to the logged ones' kernels (`log_dodging`), the GPU work between timed calls beyond the harness's own charged to
  them (`charge_between_calls`), and the reference slowed beside the candidate (`slowed_reference`).
"""
from __future__ import annotations

import math

import torch

from kevin.harness import NEUTRAL_KERNEL, busy_ms, flatten_outputs, identical, is_own_kernel

# An output whose error is this share of the reference's own magnitude (root mean square) or more is not the
# answer, whatever the tolerance: zeros pass allclose wherever every reference value is below atol (a softmax
# over 10^5 columns), and score 1.0 here. Honest fp16 or TF32 arithmetic stays near 1e-3.
SCALE_SHARE = 0.1
# Elements compared at once (in float64): the comparison's own memory stays near 200 MB, however large the output.
COMPARE_CHUNK = 1 << 22
# How much longer than the harness alone (times, plus, plus this share of the call's own time) the judge may see a
# GPU call take beyond its reported time: what the host loses around a call grows with the call (a 6 ms row sum over
# 23 GB on the H200 was seen 1.34 ms beyond its report where the harness alone took 0.59 ms).
HARNESS_SLACK, HARNESS_SLACK_MS, CALL_SLACK = 2.0, 0.1, 0.05
# At most this share of the CPU time of the runner's timed calls may be on other threads than the one that calls
# forward (plus 2 ms): on the CPU an honest candidate's other threads are idle while it runs.
MAX_OTHER_THREADS = 0.1
# How much longer than the harness alone the judge's own clock may see a reported GPU call take (medians) beyond the
# time its CUDA events report, without that being added to it; whatever is hidden from the events beyond it (work on
# a stream they never wait for, a clock rewritten in the runner's process) is paid. It is the host's noise around a
# call, which no calibration taken before the import predicts (`bench/clock_phases.py`): the GPU's share of a call
# agrees to within a few µs, but the runner's Python around it ran 0.1-0.2 ms longer around an honest kernel than
# around no model, more on a slower host, and a kernel's median moved by up to 0.25 ms from one evaluation to the
# next. Over four runs on H100s, honest kernels judged alone and among builds on all 16 cores were seen up to 0.47 ms
# beyond their events (a 0.38 ms ReLU), and a 15 ms matmul 0.47 ms: FLOOR_ALLOWANCE_MS, plus FLOOR_SHARE of the
# call's reported time. Work hidden from the events alone is bounded by the kernel log besides (`log_dodging`); the
# floor is what is left against a process that rewrites the native code behind both.
FLOOR_ALLOWANCE_MS, FLOOR_SHARE = 0.5, 0.02
# GPU time the runner may spend between two timed calls beyond the harness's own (copying the outputs out, as
# measured in the calls with no model): times, plus. What is more is the candidate's, added to each call's time.
BETWEEN_SLACK, BETWEEN_SLACK_MS = 1.1, 0.002
# How much more GPU time a candidate's calls may take under the kernel log than without it (times, plus): CUPTI
# slows some kernels themselves, one thread per element the most (a scalar tanh and ReLU over 16M floats ran 8.7%
# and 8.4% longer under it on the H200, vectorised kernels and matrix products under 1%). A candidate's reported
# calls run unlogged; their time may be shorter than the logged calls' kernels by this much and no more.
LOG_COST, LOG_SLACK_MS = 0.15, 0.005
# At most how many times slower than before the candidate was imported a loaded host may make the judge's own
# one-element kernel, when it excuses a slower reference (`slowed_reference`).
MAX_HOST_LOAD = 4.0


def median_known_within(values: list[float], share: float) -> bool:
    """Whether the median of `values` is known to within `share` of itself: half the width of its 95% interval from
    the order statistics (ranks about n/2 -+ 0.98 sqrt(n), which assume nothing of the calls' distribution) is at most
    `share` of the median. Never from fewer than 5 values."""
    n = len(values)
    if n < 5:
        return False
    ordered = sorted(values)
    spread = 0.98 * math.sqrt(n)  # the ranks n/2 - spread and n/2 + 1 + spread, 1-based, to the nearest
    low = max(0, math.floor(n / 2 - spread + 0.5) - 1)
    high = min(n - 1, math.floor(n / 2 + spread + 0.5))
    middle = ordered[n // 2]
    return middle > 0 and (ordered[high] - ordered[low]) / 2 <= share * middle


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def compare(candidate: list, reference, tolerance: dict[str, list[float]]) -> tuple[str | None, str | None, float,
                                                                                     float]:
    """(status, why, max |difference|, max |difference| / |reference|) for one trial's outputs; status None when
    they match. `candidate` is what `Judge.outputs` made of the runner's answer: tensors copied from the shared
    slots, or what came instead. The relative difference divides by |reference| floored at atol, so that zeros
    stay finite. An error of the order of the reference's own magnitude is wrong under any tolerance."""
    def mismatch(status: str, why: str) -> tuple[str, str, float, float]:
        return status, why, math.inf, math.inf

    ref = flatten_outputs(reference)
    if len(candidate) != len(ref):
        return mismatch("incorrect", f"expected {len(ref)} outputs, got {len(candidate)}")
    worst = worst_rel = 0.0
    for i, (c, r) in enumerate(zip(candidate, ref)):
        where = f"output {i}: " if len(ref) > 1 else ""
        if not isinstance(r, torch.Tensor):
            r = torch.as_tensor(r)
        if "type" in c:
            return mismatch("incorrect", f"{where}expected a tensor, got {c['type']}")
        if "not_plain" in c:
            return mismatch("rejected", f"[not-plain-tensor] {where}the output is {c['not_plain']}, not a plain "
                                        "dense torch.Tensor on the task's device")
        if c["shape"] != list(r.shape):
            return mismatch("incorrect", f"{where}shape mismatch: expected {tuple(r.shape)}, got {tuple(c['shape'])}")
        if c["dtype"] != str(r.dtype).removeprefix("torch."):
            return mismatch("incorrect", f"{where}dtype mismatch: expected {r.dtype}, got torch.{c['dtype']}")
        atol, rtol = tolerance.get(c["dtype"], tolerance["other"])
        d = _differences(c["value"], r, atol, rtol)
        if d["nan"]:
            return mismatch("rejected", f"[nan-output] {where}{d['nan']} NaN/Inf values where the reference "
                                        "is finite (unwritten output memory reads as NaN here)")
        worst, worst_rel = max(worst, d["abs"]), max(worst_rel, d["rel"])
        if d["failing"]:
            return "incorrect", (f"{where}{d['failing']} of {r.numel()} values differ beyond atol={atol:g}, "
                                 f"rtol={rtol:g} (max abs difference {d['abs']:.4g}, max relative {d['rel']:.3g})"), \
                worst, worst_rel
        scale, error = math.sqrt(d["scale_sq"] / max(d["finite"], 1)), math.sqrt(d["error_sq"] / max(d["finite"], 1))
        if scale > 0 and error >= SCALE_SHARE * scale:
            return "incorrect", (f"{where}the error is of the order of the reference's own values (root mean square "
                                 f"{error:.3g} against {scale:.3g}): within atol={atol:g} only because the values are "
                                 "smaller than it; zeros would pass that tolerance, so it is not the answer"), \
                worst, worst_rel
    return None, None, worst, worst_rel


def _chunks(*tensors: torch.Tensor):
    """Matching slices of same-shape tensors, flattened, in float64: a comparison's temporaries stay near
    COMPARE_CHUNK elements (its float64 copies, differences and masks) however large the output."""
    flat = [t.detach().reshape(-1) for t in tensors]
    for start in range(0, flat[0].numel(), COMPARE_CHUNK):
        yield [t[start:start + COMPARE_CHUNK].double() for t in flat]


def _differences(candidate: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float) -> dict:
    """Over all of `candidate` against `reference`: NaN/Inf values where the reference is finite (`nan`), the
    largest absolute and relative differences where it is finite (relative to |reference| floored at atol),
    how many values fail allclose(atol, rtol, equal_nan) (`failing`), and the sums of squares of the error and of
    the reference over its `finite` values."""
    d = {"nan": 0, "abs": 0.0, "rel": 0.0, "failing": 0, "error_sq": 0.0, "scale_sq": 0.0, "finite": 0}
    for c, r in _chunks(candidate.to(reference.device), reference):
        finite = torch.isfinite(r)
        d["nan"] += int((~torch.isfinite(c) & finite).sum())
        same = (c == r) | (c.isnan() & r.isnan())  # where the reference is not finite, allclose asks this
        d["failing"] += int((~finite & ~same).sum())
        diff, r = (c - r).abs()[finite], r[finite]
        if diff.numel():
            d["abs"] = max(d["abs"], float(diff.max()))
            d["rel"] = max(d["rel"], float((diff / r.abs().clamp_min(max(atol, 1e-30))).max()))
            d["failing"] += int((diff > atol + rtol * r.abs()).sum())
            d["error_sq"] += float(diff.square().sum())
            d["scale_sq"] += float(r.square().sum())
            d["finite"] += diff.numel()
    return d


def repeat_disagrees(first: list, again: list, tolerance: float) -> str | None:
    """How a repeated run on the same inputs differs from the first (both as `Judge.outputs` made them), if beyond
    `tolerance` of each output's largest magnitude (at least 4 epsilons of its dtype; integers exactly)."""
    if len(first) != len(again):
        return f"returned {len(again)} outputs instead of {len(first)}"
    for i, (a, b) in enumerate(zip(first, again)):
        where = f"output {i} " if i else ""
        if "value" not in a or "value" not in b:
            if a.keys() != b.keys():
                return f"{where}changed type"
            continue  # not a tensor: left to the comparison with the reference
        a, b = a["value"], b["value"]
        if (a.shape, a.dtype) != (b.shape, b.dtype):
            return f"{where}changed shape or dtype"
        if identical(a, b):
            continue
        if not a.is_floating_point():
            return f"{where}has {int((a != b).sum())} values that changed"
        bound, scale, worst = max(tolerance, 4 * torch.finfo(a.dtype).eps), 0.0, 0.0
        for x, y in _chunks(a, b):
            finite = torch.isfinite(x)
            if not torch.equal(finite, torch.isfinite(y)):
                return f"{where}has values that turned NaN/Inf or back"
            if finite.any():
                scale = max(scale, float(x[finite].abs().max()))
                worst = max(worst, float((x - y).abs()[finite].max()))
        if worst > bound * scale:
            share = worst / scale if scale else math.inf
            return (f"{where}differs from the first by up to {worst:.4g}, {share:.2g} of its largest magnitude "
                    f"({scale:.4g}; allowed: {bound:.2g} of it)")
    return None


def own_kernel_share(windows: dict, kernel_names: list[str], needed: float, max_copy_share: float
                     ) -> tuple[str | None, float | None]:
    """(the rejection or None, the measured share) over every timed call of the candidate, warm-ups included:
    its own kernels must do at least `needed` of its GPU time. Copies and fills compute nothing as a rule, but a
    transpose or a cast is work a copy does: beyond `max_copy_share` of the candidate's GPU time they count as
    library work."""
    own = library = copies = 0.0
    others: dict[str, float] = {}
    for label, kernels in windows.items():
        for name, start, end in kernels if label.startswith("candidate/") else ():
            us = end - start
            if NEUTRAL_KERNEL.search(name):
                copies += us
            elif is_own_kernel(name, kernel_names):
                own += us
            else:
                library += us
                others[name[:60]] = others.get(name[:60], 0.0) + us
    excess = max(0.0, copies - max_copy_share * (own + library + copies))
    if excess:
        others["copies and fills"] = excess
    if own + library + excess == 0:
        return "[own-kernels-idle] no GPU kernel ran during the candidate's forward", None
    share = own / (own + library + excess)
    if share < needed:
        top = sorted(others, key=others.get, reverse=True)[:3]
        return (f"[own-kernels-idle] your own kernels did {share:.0%} of the GPU work; the rest ran in library "
                f"kernels ({'; '.join(top)})"), share
    return None, share


def clock_mismatch(rows: list, windows: dict, opened: dict) -> str | None:
    """Why the runner's clocks disagree on the candidate's timed calls (medians), if they do. In each call the
    CUDA events lie inside the host's wall clock around them, and the kernels the profiler saw running from the
    begin event (the flush's end, `opened`) on inside the events: events may exceed the wall clock by 2 µs and
    fall short of the kernels' running time by 5% + 5 µs (the profiler's timestamps and the events' are read
    apart). Events are not held to the wall clock from below: a loaded host can lose any time around them."""
    events, wall = median([r[1] for r in rows]), median([r[2] for r in rows])
    kernels = median([busy_ms(windows.get(r[0], []), opened.get(r[0], -math.inf)) for r in rows])
    if events > wall + 0.002 or events < 0.95 * kernels - 0.005:
        return (f"[clock-mismatch] your timed calls take {events:.4g} ms by CUDA events, {wall:.4g} ms by the "
                f"host's clock and {kernels:.4g} ms of kernels by the profiler")
    return None


def log_dodging(logged: list, reported: list, windows: dict) -> str | None:
    """Why the reported calls' time cannot stand, if it cannot: shorter (medians) than the GPU time of the logged
    calls' kernels (every stream, those that started while the flush still ran included) beyond what the log
    costs an honest kernel (LOG_COST). The reported calls run with the kernel log's GPU side off, which a
    candidate can tell: doing less in them than in the logged calls, whose kernels the clocks and the own-kernel
    share check, gains it that much at most. Work on a side stream that the timer's events never wait for, or
    started ahead of them, is in the logged calls' kernels and not in the reported calls' events: refused here
    too, beyond that much."""
    if not logged or not reported:
        return None
    kernels = median([busy_ms(windows.get(label, [])) for label, _, _ in logged])
    events = median([ms for _, ms, _ in reported])
    if events < kernels / (1 + LOG_COST) - LOG_SLACK_MS:
        return (f"[log-dodging] your timed calls took {events:.4g} ms where the kernel log was off, and their kernels "
                f"{kernels:.4g} ms where it was on: more than the log costs an honest kernel")
    return None


def unobserved_time(candidate: list, observed: dict, harness_ms: float) -> str | None:
    """Why the runner's reported times are shorter than what the judge saw, if they are: each call's wall clock here
    (from before its inputs are written to the answer that hands its outputs over) less the reported time is what
    the harness took around it; in the least of the calls it may exceed the least of the clean harness-alone calls
    (their outputs handed over as every call's are) by HARNESS_SLACK times plus HARNESS_SLACK_MS, plus CALL_SLACK of
    its own time. A clock faked to read short, or work put off until the outputs are handed over, leaves the whole
    difference unexplained."""
    gaps = [observed[label][0] * 1e3 - (1 + CALL_SLACK) * ms for label, ms, _ in candidate if label in observed]
    allowed = HARNESS_SLACK * harness_ms + HARNESS_SLACK_MS
    if gaps and min(gaps) > allowed:
        return (f"[clock-mismatch] each of your timed calls took at least {min(gaps):.3g} ms longer, seen from the "
                f"judge's process, than its reported time, where the harness alone takes {harness_ms:.3g} ms")
    return None


def floor_allowance(reported: list) -> float:
    """How far beyond their reported time the judge may see the `reported` calls take (`judges_floor`) before the
    rest is paid, in ms: FLOOR_ALLOWANCE_MS plus FLOOR_SHARE of their median. Hidden work gains no more than that
    (the host's noise around a call, above), and the reported calls cannot raise it by more than they cost."""
    return FLOOR_ALLOWANCE_MS + FLOOR_SHARE * median([ms for _, ms, _ in reported]) if reported else FLOOR_ALLOWANCE_MS


def judges_floor(reported: list, observed: dict, harness_ms: float, allowance_ms: float) -> tuple[list, float]:
    """(the reported calls, each raised to the least time the judge's own clock allows for it, and how much longer
    than their reported time the judge saw them take, in ms): the median of the judge's wall clock around each call
    (from its inputs written to its outputs handed over) less the median of the harness alone's, against the median
    reported time. What it saw beyond `allowance_ms` is added to each call: no work the runner's events or kernel
    log do not show, nor a number its process makes up, is paid as faster than the judge's own clock allows."""
    seen = [observed[label][0] * 1e3 for label, _, _ in reported if label in observed]
    if not seen:
        return reported, 0.0
    beyond = median(seen) - harness_ms - median([ms for _, ms, _ in reported])
    extra = max(0.0, beyond - allowance_ms)
    return [(label, ms + extra, wall) for label, ms, wall in reported], beyond


def slowed_reference(calls: dict, clean: dict, max_slowdown: float) -> str | None:
    """Why the reference's time beside the candidate cannot stand, if it cannot (GPU): its fastest call slower
    than before the candidate was imported beyond `max_reference_slowdown` (and 5 µs), the allowance scaled
    by how much slower the judge's own one-element kernel ran meanwhile (a loaded host, up to MAX_HOST_LOAD).
    The runner was stopped, so only work it left on the GPU could do it."""
    if not clean or not calls.get("timer"):
        return None
    beside = min(ms for _, ms, _ in calls["reference"])
    load = min(MAX_HOST_LOAD, max(1.0, min(ms for _, ms, _ in calls["timer"]) / max(clean["timer"], 1e-6)))
    if beside > clean["reference"] * max_slowdown * load + 5e-3:
        return (f"[slowed-reference] the reference took {beside:.4g} ms (fastest call) beside the candidate and "
                f"{clean['reference']:.4g} ms without it: the candidate left work on the GPU")
    return None


def between_calls_ms(between: list, spans: dict, prefix: str, logged: set | None = None) -> list[float]:
    """The GPU time of the kernels the runner ran after each timed call whose label starts with `prefix` (and is
    in `logged`, where given: after an unlogged call the log is off until its outputs are handed over), up to the
    next window of the same kind (after the last window of all, to the end): the gap after the last clean call,
    which the import and the correctness checks fill, is left out."""
    order = sorted((tuple(span), label) for label, span in spans.items())
    gaps = []
    for ((_, end), label), following in zip(order, [*order[1:], None]):
        if label.startswith(prefix) and (logged is None or label in logged) and \
                (following is None or following[1].startswith(prefix)):
            until = following[0][0] if following else math.inf
            gaps.append(busy_ms([("", a, b) for a, b in between if end <= a < until]))
    return gaps


def charge_between_calls(rows: list, log: dict, logged: set) -> tuple[list, float]:
    """(the candidate's calls with the GPU time the runner spent between them beyond the harness's own added to
    each, that time per call in ms): work launched before a call's window opens, or while its outputs are handed
    over (a rewritten synchronize or copy), is the call's too. The harness's own is what the clean calls spent
    between them, copying the same slots' worth of outputs."""
    between, spans = log.get("between") or [], log.get("spans") or {}
    clean = between_calls_ms(between, spans, "null/", logged)
    spent = between_calls_ms(between, spans, "candidate/", logged)
    if not clean or not spent:
        return rows, 0.0
    extra = max(0.0, sum(spent) / len(spent) - BETWEEN_SLACK * median(clean) - BETWEEN_SLACK_MS)
    return [(label, ms + extra, wall) for label, ms, wall in rows], extra


def other_threads_worked(other_s: float, observed: dict) -> str | None:
    """Why the runner's calls were not the work of one thread, if they were not (CPU): the CPU time of its threads
    other than the one that calls forward, as the kernel counts it, over its timed calls, against all of theirs.
    However the threads were started (OpenMP, _thread, native code), their time shows; CPU time, unlike the
    wall clock, does not shrink when other work on the machine takes the cores."""
    total = sum(cpu for _, cpu in observed.values())
    if other_s > MAX_OTHER_THREADS * total + 0.002:
        return (f"[threads] {other_s * 1e3:.3g} ms of the {total * 1e3:.3g} ms of CPU time of your timed calls ran on "
                "threads other than the one that called forward")
    return None
