"""How far evaluate.py's speedups are from a clean measurement of the same kernels, in one run on one machine.

For every kernel of solutions/<device>/ (and of --extra folders) whose name says `correct`:
  alone   `evaluate.evaluate` on these kernels only;
  clean   a bare process per kernel: the task's Model and the candidate's ModelNew built under the same seed,
          no profiler, no checks, no sandbox; the two called in turn on one draw of inputs, each call after the
          L2 flushed by zeroing 512 MB, timed by CUDA events around the call alone, median of --calls (as
          KernelBench's cuda_event method; on the CPU the wall clock around the call); its load_inline loads the
          library `alone` built for the same arguments, so that both time one binary and nothing is built twice;
  again   the clean measurement once more, in another bare process after all the first ones: how far two clean
          measurements of one kernel are apart, the least that any comparison between processes can show;
  batch   `evaluate.evaluate` on them inside every other candidate of the same folders: faults, hanging
          kernels, tricks and their builds beside them.
It prints a row per kernel (clean speedup; the second clean one's and evaluate's, alone and in the batch, as a
ratio to the clean one;
the candidate's and the reference's times as ratios too, which tell the side a bias is on) and the median
and worst ratios, and writes every number to --out.

    python bench/timing_fidelity.py --out results/timing_fidelity_h200.json
    python bench/timing_fidelity.py --device cpu --calls 20          # the same machinery on a CPU
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def clean_times(task: str, candidate: str, device: str, calls: int, threads: int, builds: str, arch: str) -> dict:
    """In this (fresh) process: the median milliseconds of the reference and the candidate, called in turn, torch
    on as many threads as the evaluator gives it; the candidate's extensions are the libraries an evaluator built
    in `builds` for the architectures `arch`, found as it finds them, and none is built here."""
    import torch

    from kevin.build_cache import library_path, load_from_cache
    from kevin.harness import flush_buffer, import_file

    def built(arguments: dict) -> dict:
        _, arguments, library = library_path(Path(builds), arguments, arch)
        return {"library": str(library), "name": arguments["name"]} if library.exists() else \
            {"error": f"the evaluator built no {library.name} in {builds}"}

    load_from_cache(built)
    torch.set_num_threads(threads)
    module, new = import_file(task, "task"), import_file(candidate, "candidate")
    dev = torch.device(device)
    torch.manual_seed(42)
    reference = module.Model(*module.get_init_inputs()).to(dev).eval()
    torch.manual_seed(42)
    model = new.ModelNew(*module.get_init_inputs()).to(dev).eval()
    torch.manual_seed(0)
    with dev:
        inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    flush = flush_buffer(dev)  # the evaluator's own: the same bytes flushed on both sides

    def once(fn) -> float:
        if flush is None:
            began = time.perf_counter()
            fn(*inputs)
            return (time.perf_counter() - began) * 1e3
        flush.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        fn(*inputs)
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end)

    times = {"reference": [], "candidate": []}
    with torch.no_grad():
        for _ in range(3):  # warm-up
            once(reference), once(model)
        for _ in range(calls):
            times["reference"].append(once(reference))
            times["candidate"].append(once(model))
    return {name: statistics.median(ms) for name, ms in times.items()}


def clean(record: dict, device: str, calls: int, threads: int, builds: str, arch: str) -> dict:
    """clean_times in a bare process of its own, on the libraries built in `builds` for `arch`."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(record["code"])
    try:
        command = [sys.executable, __file__, "--clean", record["task_path"], f.name, "--device", device,
                   "--calls", str(calls), "--threads", str(threads), "--builds", builds, "--arch", arch]
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    finally:
        os.unlink(f.name)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--calls", type=int, default=100, help="timed calls of each model in the clean measurement")
    p.add_argument("--extra", nargs="*", default=None,
                   help="more candidate folders (default: tests/adversarial/<device>, whose honest twins are timed "
                        "too and whose tricks fill the batch)")
    p.add_argument("--out", help="write every number to this JSON file")
    p.add_argument("--batch", action=argparse.BooleanOptionalAction, default=True,
                   help="also judge the honest kernels inside the whole batch (--no-batch: alone only)")
    p.add_argument("--run-timeout-s", type=float, default=60.0,
                   help="the evaluator's limit per candidate (the batch's hanging kernel holds the GPU this long)")
    p.add_argument("--match", default="", help="only the honest kernels whose name holds this text (the batch "
                   "keeps every candidate)")
    p.add_argument("--threads", type=int, default=None, help="torch's threads in the clean measurement (default: "
                   "the evaluator's --cpu-threads)")
    p.add_argument("--clean", nargs=2, metavar=("TASK", "CANDIDATE"), help=argparse.SUPPRESS)  # one bare process
    p.add_argument("--builds", help=argparse.SUPPRESS)  # the evaluator's build folder it loads from,
    p.add_argument("--arch", default="", help=argparse.SUPPRESS)  # and the architectures its builds are keyed by
    args = p.parse_args()
    if args.clean:
        print(json.dumps(clean_times(*args.clean, args.device, args.calls, args.threads, args.builds, args.arch)))
        return

    from kevin import evaluator as ev

    from kevin.eval_children import child_settings
    from kevin.eval_records import library_records

    from kevin.tasks import index_tasks
    from kevin.eval_records import with_tasks_from

    kind, gpus = ev.resolve_device(ev.EvalConfig(device=args.device))
    task_folder = str(ROOT / ("tasks" if kind == "cuda" else "tests/tasks"))
    tasks, threads = index_tasks(task_folder), args.threads or ev.EvalConfig().cpu_threads
    folders = [ROOT / "solutions" / kind] + [Path(f) for f in (args.extra if args.extra is not None
                                                                 else [ROOT / "tests" / "adversarial" / kind])]
    everything, honest = [], []  # the solutions' correct kernels and the tricks' honest twins
    for folder in folders:
        records = with_tasks_from(library_records(folder), tasks, ROOT / "tests" / "adversarial" / "tasks")
        everything += records
        honest += [r for r in records if r["solution"].split(".", 1)[1].startswith("correct_")
                   and (folder == folders[0] or "honest-twin" in r["solution"]) and args.match in r["solution"]]
    for r in honest:
        r["task_path"] = str(tasks[r["task"]]) if r["task"] in tasks else r["task"]
    device = gpus[0] if kind == "cuda" else "cpu"
    print(f"{len(honest)} honest kernels, a batch of {len(everything)}, on {device}", file=sys.stderr)

    arch = child_settings(kind, [], {})["run"].env.get("TORCH_CUDA_ARCH_LIST", "")  # as the evaluator keys builds
    cfg = ev.EvalConfig(device=kind, tasks=task_folder, gpus=[int(device.split(":")[1])] if kind == "cuda" else None,
                        cpu_threads=threads, run_timeout_s=args.run_timeout_s, progress=False)
    alone = ev.evaluate(honest, cfg)
    cleaned, again = ([clean(r, device, args.calls, threads, cfg.build_dir, arch) for r in honest]  # one at a time
                      for _ in range(2))
    batch = {id(r): e for r, e in zip(everything, ev.evaluate(everything, cfg))} if args.batch else {}
    rows = []
    for r, c, c2, a in zip(honest, cleaned, again, alone):
        row = {"kernel": r["solution"], "clean": c, "again": c2, "alone": summary(a),
               "batch": summary(batch.get(id(r), {}))}
        if "error" not in c:
            row["clean"]["speedup"] = c["reference"] / c["candidate"]
            if "error" not in c2:
                c2["speedup"] = c2["reference"] / c2["candidate"]
                c2["ratio"] = c2["speedup"] / c["speedup"]
            for side in ("alone", "batch"):
                e = row[side]
                if e["speedup"]:
                    e["ratio"] = e["speedup"] / row["clean"]["speedup"]
                    e["candidate_ratio"] = e["runtime_ms"] / c["candidate"]
                    e["reference_ratio"] = e["ref_runtime_ms"] / c["reference"]
        rows.append(row)
    report(rows)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": kind, "calls": args.calls, "rows": rows}, indent=1))


def summary(result: dict) -> dict:
    return {k: result.get(k) for k in ("status", "speedup", "runtime_ms", "ref_runtime_ms", "unreported_ms",
                                       "floor_allowance_ms")}


def report(rows: list[dict]) -> None:
    def cell(e: dict, key: str) -> str:
        return f"{e[key]:.3f}" if e.get(key) else e.get("status", "-")

    print("| kernel | clean speedup | again / clean | alone / clean | batch / clean | candidate ms alone / clean | "
          "reference ms alone / clean |\n|---|---|---|---|---|---|---|")
    for row in rows:
        c, a, b = row["clean"], row["alone"], row["batch"]
        clean_cell = f"{c['speedup']:.3f}" if "speedup" in c else c.get("error", "-")
        print(f"| {row['kernel']} | {clean_cell} | {cell(row['again'], 'ratio')} | {cell(a, 'ratio')} | "
              f"{cell(b, 'ratio')} | {cell(a, 'candidate_ratio')} | {cell(a, 'reference_ratio')} |")
    for side in ("again", "alone", "batch"):
        ratios = [row[side]["ratio"] for row in rows if row[side].get("ratio")]
        if ratios:
            worst = max(ratios, key=lambda x: abs(x - 1))
            print(f"{side}: median ratio {statistics.median(ratios):.3f}, worst {worst:.3f}, "
                  f"within 3%: {sum(abs(x - 1) <= 0.03 for x in ratios)}/{len(ratios)}")
        if side == "again":  # two clean processes: no judge's clock to report
            continue
        for key, what in (("unreported_ms", "the judge's clock beyond the events"),
                          ("floor_allowance_ms", "the floor's allowance")):
            micros = sorted(row[side][key] * 1e3 for row in rows if row[side].get(key) is not None)
            if micros:  # how much longer than its events the judge saw each honest kernel's calls take, and allowed
                picks = {q: micros[min(len(micros) - 1, int(q * len(micros)))] for q in (0.5, 0.9)}
                print(f"{side}: {what}, µs: min {micros[0]:.1f}, median {picks[0.5]:.1f}, 90% {picks[0.9]:.1f}, "
                      f"max {micros[-1]:.1f}")
        charged = [row["kernel"] for row in rows if (row[side].get("unreported_ms") or 0) >
                   (row[side].get("floor_allowance_ms") or math.inf)]
        print(f"{side}: charged beyond its events: {len(charged)} ({', '.join(charged) or 'none'})")


if __name__ == "__main__":
    main()
