"""What each way of timing one call adds to it: the tasks' PyTorch references timed side by side, in one
process, each protocol a median over --trials calls (L2 flushed before every call), the protocols of a
phase interleaved so that drift hits them alike:
  idle        the GPU drained before the call, CUDA events around it: what KernelBench measures
  queued      the flush still running when the call is launched: the host's launch latency hides behind
              the flush
  timer       evaluate.py's timer (harness.make_timer): queued, with a device-wide synchronize after the
              closing event and the host's clock around both
then, with the kernel log on (torch.profiler, CPU and CUDA activity, as in every defended call), `idle`
and `timer` again, and `timer` under CUDA activity alone (CUPTI's tracing, whose cost is on the GPU itself).
--candidates times hand-written kernels' ModelNew instead of the references (the kernel log is on only in
the candidate's process). A protocol's excess over `idle` is what it adds to every call: it compresses the
speedups of fast kernels. (The timer before this one drained the flush first and synchronized the device
before its closing event: 0.026 to 0.067 ms above `idle` on the H200, 0.037 to 0.089 ms with the log on.)

    python bench/timer_protocols.py --out results/timer_protocols_h200.json     # on the GPU machine
    python bench/timer_protocols.py --candidates solutions/cuda/level1/10_Tanh.correct_scalar.py \
        solutions/cuda/level1/7_ReLU.correct_templated.py --out results/timer_protocols_candidates_h200.json
"""
import argparse
import json
import statistics
from pathlib import Path

import torch

from kevin import evaluator as ev
from kevin.tasks import index_tasks, resolve_task
from kevin.harness import KernelLog, flush_buffer, import_file, make_timer  # noqa: E402

TASKS = ["level1/7_ReLU", "level1/9_Swish", "level1/17_Softmax", "level1/20_RMSNorm",
         "level1/25_MSELoss_PerSample", "level1/1_Square_Matmul"]


def events_ms(fn, args: list, flush: torch.Tensor, drained: bool) -> float:
    flush.zero_()
    if drained:
        torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn(*args)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end)


def interleaved(trials: int, protocols: dict) -> dict[str, float]:
    times = {name: [] for name in protocols}
    for _ in range(trials):
        for name, time_one in protocols.items():
            times[name].append(time_one())
    return {name: statistics.median(ts) for name, ts in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=TASKS, help="task ids under tasks/")
    p.add_argument("--trials", type=int, default=100, help="timed calls per task and protocol (median reported)")
    p.add_argument("--candidates", nargs="+", default=[], help="candidate files (solutions/cuda/<level>/<task>.*.py) "
                   "to time instead of the tasks' references")
    p.add_argument("--out", help="write the medians to this JSON file")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: needs a CUDA GPU")
    index = index_tasks(ev.ROOT / "tasks")
    rows = []
    names = ["idle", "queued", "timer", "idle+prof", "timer+prof", "timer+cuda"]
    print("| model | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    models = [(c, f"{Path(c).parent.name}/{Path(c).name.split('.')[0]}") for c in args.candidates] or \
        [(task, task) for task in args.tasks]
    for name, task in models:
        module = import_file(str(resolve_task(task, index)), "reference_task")
        torch.manual_seed(42)
        model = module.Model if name == task else import_file(name, "candidate").ModelNew
        reference = model(*module.get_init_inputs()).cuda().eval()
        torch.manual_seed(1)
        with torch.device("cuda"):
            inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
        flush = flush_buffer(torch.device("cuda"))
        with torch.no_grad():
            for _ in range(10):  # warm-up
                reference(*inputs)
            timer = make_timer(True, flush, None)
            medians = interleaved(args.trials, {
                "idle": lambda: events_ms(reference, inputs, flush, drained=True),
                "queued": lambda: events_ms(reference, inputs, flush, drained=False),
                "timer": lambda: timer(reference, inputs, "call")[0]})
            kernel_log = KernelLog()
            timer = make_timer(True, flush, kernel_log)
            medians |= {f"{name}+prof": ms for name, ms in interleaved(args.trials, {
                "idle": lambda: events_ms(reference, inputs, flush, drained=True),
                "timer": lambda: timer(reference, inputs, "call")[0]}).items()}
            kernel_log.stop(set())
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
                timer = make_timer(True, flush, None)
                medians |= {"timer+cuda": interleaved(args.trials, {"t": lambda: timer(reference, inputs, "")[0]})["t"]}
        rows.append({"task": task, **({"candidate": name} if name != task else {}), "median_ms": medians})
        print(f"| {name} | {medians['idle']:.4f} | " + " | ".join(
            f"{medians[n]:.4f} ({medians[n] - medians['idle']:+.4f})" for n in names[1:]) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "trials": args.trials,
                                              "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
