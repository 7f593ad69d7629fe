"""Time every task's eager PyTorch forward on a GPU, to check that the task set is sized as intended.

For each task file under a folder (default tasks/, searched recursively): seed 42, build
Model(*get_init_inputs()) and get_inputs() directly on cuda, warm up, time --trials forwards with CUDA
events (median), and read the peak memory (torch.cuda.max_memory_allocated). A task is flagged when
  "<0.1ms"  its median is under 0.1 ms, so launch overhead would dominate any speedup;
  ">4GB"    its peak memory is over 4 GB;
  "flat"    a constant (the output's own mean) passes torch.allclose(atol=rtol=1e-2) against the output,
            so a candidate that returns a constant would be judged correct;
  "error"   it failed to build or run (the message is printed).
Prints a markdown table (task | ms | peak GB | flag) and the number of flagged tasks; --out also writes JSON.

Run on the GPU machine:
    python bench/task_times.py                      # all of tasks/
    python bench/task_times.py --tasks tasks/level2 --out runs/task_times.json
Simplifications: no L2 flush between trials (every task moves far more than the H200's ~60 MB of L2);
forwards run under torch.no_grad(); TF32 stays at PyTorch's defaults, printed at the start.
"""
import argparse
import importlib.util
import json
import re
import statistics
from pathlib import Path
from types import ModuleType

import torch
from tqdm import tqdm

MIN_MS = 0.1
MAX_GB = 4.0
FLAT_TOLERANCE = 1e-2


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, default=Path("tasks"), help="folder of task files, searched recursively")
    parser.add_argument("--trials", type=int, default=50, help="timed forwards per task; the median is reported")
    parser.add_argument("--warmup", type=int, default=5, help="untimed forwards before timing")
    parser.add_argument("--seed", type=int, default=42, help="torch seed set before building each model and its inputs")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON to this path")
    return parser.parse_args()


def task_files(folder: Path) -> list[Path]:
    """Task files in KernelBench order: by folder, then by the number that opens the file name."""
    def order(path: Path) -> tuple:
        number = re.match(r"\d+", path.stem)
        return (str(path.parent), int(number.group()) if number else 1 << 30, path.stem)
    return sorted((p for p in folder.rglob("*.py") if not p.name.startswith("_")), key=order)


def load_task(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"task_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def median_forward_ms(model: torch.nn.Module, inputs: list, warmup: int, trials: int) -> float:
    for _ in range(warmup):
        model(*inputs)
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        model(*inputs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def is_flat(output: torch.Tensor) -> bool:
    """True when filling the output with its own mean would pass the correctness check."""
    values = output.float()
    constant = torch.full_like(values, values.mean(dtype=torch.float64).item())
    return torch.allclose(constant, values, atol=FLAT_TOLERANCE, rtol=FLAT_TOLERANCE)


def bench_task(path: Path, args: argparse.Namespace) -> dict:
    module = load_task(path)
    torch.manual_seed(args.seed)
    with torch.device("cuda"), torch.no_grad():
        model = module.Model(*module.get_init_inputs())
        inputs = module.get_inputs()
        ms = median_forward_ms(model, inputs, args.warmup, args.trials)
        peak_gb = torch.cuda.max_memory_allocated() / 1e9  # read before the flatness check allocates more
        flat = is_flat(model(*inputs))
    flags = [name for name, hit in (("<0.1ms", ms < MIN_MS), (">4GB", peak_gb > MAX_GB), ("flat", flat)) if hit]
    return {"ms": ms, "peak_gb": peak_gb, "flags": flags}


def main() -> None:
    args = parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("task_times.py needs a CUDA GPU and none is visible; run it on the GPU machine")
    if not args.tasks.is_dir():
        raise SystemExit(f"no task folder at {args.tasks}")
    files = task_files(args.tasks)
    if not files:
        raise SystemExit(f"no task files (*.py) under {args.tasks}")

    device = torch.cuda.get_device_name()
    print(f"{device}; TF32 matmul={torch.backends.cuda.matmul.allow_tf32}, TF32 cuDNN={torch.backends.cudnn.allow_tf32}")
    rows = []
    for path in tqdm(files, desc="tasks"):
        task = f"{path.parent.name}/{path.stem}"
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            result = bench_task(path, args)
        except Exception as error:  # a broken or oversized task is reported, and the rest still run
            tqdm.write(f"{task}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
            result = {"ms": None, "peak_gb": None, "flags": ["error"]}
        rows.append({"task": task, **result})

    print("\n| task | ms | peak GB | flag |\n|---|---:|---:|---|")
    for row in rows:
        ms = "-" if row["ms"] is None else f"{row['ms']:.3f}"
        gb = "-" if row["peak_gb"] is None else f"{row['peak_gb']:.2f}"
        print(f"| {row['task']} | {ms} | {gb} | {' '.join(row['flags'])} |")
    flagged = sum(bool(row["flags"]) for row in rows)
    print(f"\n{flagged} of {len(rows)} tasks flagged")

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"device": device, "trials": args.trials, "flagged": flagged, "tasks": rows}
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
