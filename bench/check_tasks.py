"""Flag degenerate tasks: ones a kernel could pass without computing what they ask.

Each task's reference runs three times, from (init seed, input seed) = (42, 1), (42, 2) and (43, 1): the
first output must not be nearly constant, must change with the inputs, and (where the model has
parameters) with them. Exit status 1 if any task is flagged.

    python bench/check_tasks.py tasks/
    python bench/check_tasks.py tasks --device cpu > results/check_tasks_cpu.md   # the table; progress on stderr
"""
import argparse
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from kevin import evaluator as ev
from kevin.tasks import index_tasks
from kevin.harness import flatten_outputs, import_file  # noqa: E402


def check_task(path: Path, device: str, atol: float = 1e-2, rtol: float = 1e-2) -> list[str]:
    """Why a task is degenerate, if it is (see the module docstring); [] for a sound one."""
    task = import_file(str(path), "reference_task")

    def output(init_seed: int, input_seed: int):
        torch.manual_seed(init_seed)
        init_inputs = task.get_init_inputs()
        torch.manual_seed(init_seed)
        model = task.Model(*init_inputs).to(device).eval()
        torch.manual_seed(input_seed)
        inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
        with torch.no_grad():
            out = model(*inputs)
        return [torch.as_tensor(o).double() for o in flatten_outputs(out)], any(True for _ in model.parameters())

    def same(a: list, b: list) -> bool:
        return all(x.shape == y.shape and torch.allclose(x, y, atol=atol, rtol=rtol) for x, y in zip(a, b))

    base, has_parameters = output(42, 1)
    flags = []
    if same(base, [torch.full_like(o, float(o.mean())) for o in base]):
        flags.append("nearly constant output")
    if same(base, output(42, 2)[0]):
        flags.append("output does not depend on the inputs")
    if has_parameters and same(base, output(43, 1)[0]):
        flags.append("output does not depend on the parameters")
    return flags


def check_tasks(folder: str, device: str) -> int:
    """Print a table of every task's flags on stdout, so `> file.md` keeps it (progress goes to stderr); the
    number of flagged tasks."""
    tasks = index_tasks(folder)
    flagged = 0
    lines = ["| task | flags |", "|---|---|"]
    for task_id, path in tqdm(tasks.items(), desc="checking tasks", file=sys.stderr):
        flags = check_task(path, device)
        flagged += bool(flags)
        lines.append(f"| {task_id} | {'; '.join(flags) or 'ok'} |")
    print("\n".join(lines) + f"\n\n{flagged} of {len(tasks)} tasks flagged")
    return flagged


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="task folder (or KernelBench level folder)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when a GPU is visible)")
    args = p.parse_args()
    device = ev.resolve_device(ev.EvalConfig(device=args.device))[1][0]
    sys.exit(1 if check_tasks(args.folder, device) else 0)


if __name__ == "__main__":
    main()
