"""Training and evaluation on several GPUs, shown in one command: train.py under DDP and FSDP against one
process on one GPU, and evaluate.py spreading candidates over all GPUs against one.

Checks, one row each in the closing table (the JSON at --out holds every number):
  offline match  one fixed batch (a rollouts file: 4 tasks x 2 trajectories x 2 turns of real token ids,
                 sampling log-probs from the model itself, non-zero advantages from reward.py) trained by
                 `train.py --rollouts` as one process on one GPU, and as DDP and as FSDP over N processes,
                 for the tiny model and the Qwen2-0.5B-shaped one, in fp32 and in bf16. Against the one-GPU
                 run: loss and gradient norm of both steps (the largest relative difference), and the final
                 weights (--out/final) as ||w_N - w_1|| / ||w_1 - w_initial||, the difference relative
                 to the update itself. Step 2 has one task, so some ranks only join the others' collectives.
                 FSDP must really shard: its checkpoint is written in shards. (A random model's own rollouts
                 have all-zero advantages, so no update: hence the fixed batch.)
  online steps   two online steps under DDP and FSDP for both models (bf16 on a GPU), every rank rolling
                 out and evaluating its own task. nvidia-smi, sampled twice a second, says on which GPU each
                 rank's process held memory (the process's LOCAL_RANK read from /proc/PID/environ).
  evaluation     the same candidates (correct kernels of solutions/cuda, copies differing by a comment
                 line so that none is merged with another) evaluated with GPU 0 alone, then with all GPUs,
                 after a warm-up evaluation has filled the build cache (it runs in the background while
                 the training runs do): kernels per minute of each and their ratio, and the GPUs that the
                 evaluation's processes were seen on.

Tolerances (TOLERANCES). fp32: the runs differ only in summation order (all-reduce, micro-batch grouping),
so 1e-4 on loss and gradient norm and 1e-3 on the weights; this catches subtle errors too (a rank that
trains on the wrong task moves the gradient norm by ~2% and the weights by ~20%). bf16: rounding depends
on batch shapes, and under FSDP the parameters are cast to bf16 and gradients reduced in bf16 while the
other runs autocast around fp32 weights; Adam then turns small gradient differences into sign flips of
whole lr-sized steps. So 5e-2 on loss and gradient norm and 0.3 on the weights: enough to catch a wrongly
scaled or missing rank's gradient (0.5 or more), not subtler errors. The "bf16 against fp32" rows show how
far bf16 alone moves the one-process run.

Budget on 2 H200s and 32 cores, about 5-6 minutes: models and batches ~30 s (the 0.5B-shaped model is
initialised on the CPU); the 12 offline runs at once ~90 s, the build warm-up beside them; the 4 online
runs at once ~60 s; evaluation of 12 candidates (2-6 s of checking and timing each on an H200,
results/legit_kernels_h200.jsonl, plus process start) ~75 s on one GPU and ~40 s on two.

    python bench/multi_gpu.py --out results/multi_gpu_h200x2.json          # on the GPU machine
    python bench/multi_gpu.py --models tiny --strategies ddp --parts offline online    # CPU (gloo)

Without GPUs accelerate runs the FSDP config as plain DDP (MULTI_CPU), so FSDP needs GPUs, and so does
the evaluation part. A run that fails or is out of tolerance makes the exit status non-zero.
"""
import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # train.py itself, which no install holds
from kevin import batching  # noqa: E402
from kevin import evaluator as ev
from kevin import rewards
from kevin.eval_records import library_records
import train  # noqa: E402
from kevin.tiny_model import build_qwen2_05b_shaped, build_tiny_model  # noqa: E402

ROOT = ev.ROOT
MODELS = {"tiny": build_tiny_model, "qwen2-0.5b": build_qwen2_05b_shaped}
CONFIGS = {"ddp": ROOT / "configs" / "ddp.yaml", "fsdp": ROOT / "configs" / "fsdp.yaml"}
TOLERANCES = {"fp32": {"loss": 1e-4, "grad_norm": 1e-4, "weights": 1e-3},
              "bf16": {"loss": 5e-2, "grad_norm": 5e-2, "weights": 0.3}}
LR = 1e-4  # large enough that the update stands well above fp32 rounding of the weights
MAX_TOKENS = 128  # the loss's length normaliser; longer than every reply of the fixed batch
# Correct kernels whose check and timing take 2-6 s each on an H200 (results/legit_kernels_h200.jsonl).
EVAL_KERNELS = ["level1/20_RMSNorm.correct_fused", "level2/1_Gemm_ReLU_Scale.correct_tiled",
                "level1/10_Tanh.correct_scalar", "level1/19_LayerNorm.correct_two_kernels",
                "level1/7_ReLU.correct_vec4", "level1/9_Swish.correct_fused"]
TAG = "MULTI_GPU_RUN"  # set in every launched process's environment, so nvidia-smi's pids can be named


# ---------------------------------------------------------------- which GPU each process used
class GpuWatch:
    """Samples nvidia-smi twice a second: for each process on a GPU, its run tag and LOCAL_RANK (read
    from /proc/PID/environ), the GPU index and its memory. Needs no cooperation from the programs."""

    def __init__(self):
        self.samples: list[tuple[float, str, str, int, float]] = []  # time, tag, rank, gpu, MiB
        self.available = torch.cuda.is_available() and shutil.which("nvidia-smi") is not None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        if self.available:
            self._thread.start()

    @staticmethod
    def query(what: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", f"--query-{what}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]

    def _loop(self):
        index = {uuid: int(i) for i, uuid in self.query("gpu=index,uuid")}
        while not self._stop.wait(0.5):
            try:
                apps = self.query("compute-apps=pid,gpu_uuid,used_memory")
            except subprocess.SubprocessError:
                continue
            for pid, uuid, mib in apps:
                try:
                    raw = Path(f"/proc/{pid}/environ").read_bytes()
                except OSError:  # gone already, or not ours
                    continue
                env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
                if TAG in env and uuid in index:
                    self.samples.append((time.time(), env[TAG], env.get("LOCAL_RANK", "-"), index[uuid],
                                         float(mib) if mib.replace(".", "").isdigit() else 0.0))

    def stop(self):
        self._stop.set()

    def placement(self, tag: str) -> dict[str, dict[int, float]]:
        """{rank: {gpu: peak MiB}} of one run."""
        seen: dict[str, dict[int, float]] = {}
        for _, t, rank, gpu, mib in self.samples:
            if t == tag:
                seen.setdefault(rank, {})[gpu] = max(mib, seen.get(rank, {}).get(gpu, 0.0))
        return seen

    def gpus_between(self, tag: str, start: float, end: float) -> list[int]:
        """The GPUs that processes of this tag held memory on between two times."""
        return sorted({gpu for when, t, _, gpu, _ in self.samples if t == tag and start <= when <= end})


def placement_verdict(seen: dict[str, dict[int, float]], world: int) -> tuple[bool | None, str]:
    """Every rank on a GPU of its own (the one where it holds the most memory): True, False, or None
    where nothing was seen."""
    if not seen:
        return None, "not observed"
    main = {rank: max(gpus, key=gpus.get) for rank, gpus in seen.items()}
    text = " ".join(f"r{rank}->GPU{gpu}" for rank, gpu in sorted(main.items())) + "".join(
        f" (r{rank} also GPU{g}: {mib:.0f} MiB)" for rank, gpus in sorted(seen.items()) for g, mib in gpus.items()
        if g != main[rank])
    ok = len(main) == world and len(set(main.values())) == world and all(str(r) == str(g) for r, g in main.items())
    return ok, text


def placement_check(watch: GpuWatch, tag: str, world: int, numbers: dict) -> tuple[bool, str]:
    """Where nvidia-smi saw a launch's ranks, also put in numbers["placement"]: (False only if a rank was
    seen off its own GPU, ", r0->GPU0 ..."); (True, "") where nvidia-smi cannot be read."""
    if not watch.available:
        return True, ""
    placed, where = placement_verdict(watch.placement(tag), world)
    numbers["placement"] = where
    return placed is not False, f", {where}"


# ---------------------------------------------------------------- launches
def verdict(ok: bool | None) -> str:
    return "info" if ok is None else "pass" if ok else "FAIL"


class Checks(list):
    """The rows of the closing table, (check, pass / fail / None for information, numbers); each is
    printed as soon as it is decided, so a run cut short still shows what it found."""

    def add(self, check: str, ok: bool | None, text: str):
        self.append((check, ok, text))
        print(f"{verdict(ok)}: {check}: {text}", flush=True)


@dataclass
class Launch:
    tag: str
    command: list[str]
    out: Path
    env: dict = field(default_factory=dict)
    returncode: int | None = None
    timeout_s: float = float("inf")
    seconds: float = 0.0


def train_launch(tag: str, strategy: str | None, processes: int, args: list[str], work: Path, port: int,
                 gpu: int | None = None) -> Launch:
    """train.py as one plain process (strategy None; on GPU `gpu` alone) or through accelerate launch."""
    out = work / tag
    if strategy is None:
        command = [sys.executable, str(ROOT / "train.py")]
    else:
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS[strategy]),
                   "--num_processes", str(processes), "--main_process_port", str(port), str(ROOT / "train.py")]
    env = {"OMP_NUM_THREADS": "1", TAG: tag}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    return Launch(tag, command + args + ["--out", str(out), "--overwrite"], out, env)  # --work-dir reused


def stop(process: subprocess.Popen) -> None:
    """End a launch this script started: SIGTERM first, which accelerate's launcher passes on to the ranks
    (each runs in a session of its own), then SIGKILL to the launch's process group."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_wave(launches: list[Launch], timeout_s: float, desc: str) -> None:
    """Start every launch at once and wait for all; one still running after timeout_s is stopped."""
    from tqdm import tqdm

    running = {}
    for launch in launches:
        launch.timeout_s = timeout_s
        launch.out.mkdir(parents=True)
        log = open(launch.out / "launch.log", "w")
        process = subprocess.Popen(launch.command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, **launch.env}, start_new_session=True)
        running[launch.tag] = (launch, process, log, time.perf_counter())
    try:
        with tqdm(total=len(launches), desc=desc, unit="run", file=sys.stderr) as bar:
            while running:
                time.sleep(1)
                for tag, (launch, process, log, started) in list(running.items()):
                    if process.poll() is None and time.perf_counter() - started > timeout_s:
                        stop(process)
                    if process.poll() is not None:
                        launch.returncode, launch.seconds = process.returncode, time.perf_counter() - started
                        log.close()
                        del running[tag]
                        bar.update(1)
    finally:  # interrupted: the launches run in sessions of their own, so end them here
        for _, process, log, _ in running.values():
            stop(process)
            log.close()


def failure(launch: Launch) -> str:
    """Why a launch failed, in one line, with the end of its log written out for a reader."""
    lines = (launch.out / "launch.log").read_text(errors="replace").strip().splitlines()
    first = next((i for i, line in enumerate(lines) if re.search(r"Traceback|(^|\]: )error: ", line)), len(lines))
    # what came before the first traceback (a rank that aborts in C++ prints none of its own), the traceback,
    # then the launcher's end
    tail = lines[max(first - 15, 0):first + 40] + ["..."] + lines[-10:]
    print(f"\n--- {launch.tag} exited {launch.returncode}; last lines of {launch.out / 'launch.log'}:\n"
          + "\n".join(tail), file=sys.stderr)
    why = "stopped at --launch-timeout-s" if launch.seconds > launch.timeout_s else f"exit {launch.returncode}"
    return f"{why} after {launch.seconds:.0f} s (log: {launch.tag}/launch.log in the work folder)"


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def load_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}


# ---------------------------------------------------------------- the fixed batch
def write_rollouts(path: Path, model_path: str) -> int:
    """4 tasks x 2 trajectories x 2 turns as generate.py writes them, rewards added by reward.py: in each
    task one trajectory writes a correct kernel at turn 2. Correct replies are long and the others
    short, so the loss is not a near-cancelling sum. Sampling log-probs come from the model itself in
    fp32 on the CPU (no GPU is touched by this process). Returns the number of non-zero advantages."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    records, samples = [], []
    for t, task in enumerate(["toy/add", "toy/mul", "toy/relu", "toy/scan"]):
        for k in range(2):
            turns = []
            for turn in range(2):
                messages = [{"role": "user", "content": f"Write a CUDA kernel for {task}, attempt {turn + 1}."}]
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)
                correct = (k, turn) == (t % 2, 1)
                text = (f"The kernel for {task} takes one thread per element.\n```python\n"
                        f"class ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                        f"        return kernel_{t}_{k}(x)  # {'grid-stride loop ' * (3 + t)}\n```"
                        if correct else f"Attempt {k}{turn}: a loop {'over rows ' * (1 + t + k)}that failed.")
                reply = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
                samples.append(batching.Sample(prompt, reply, None, 0.0))
                turns.append({"turn": turn, "prompt": {"messages": messages, "token_ids": prompt},
                              "reply": {"text": text, "token_ids": reply}, "code": "", "summary": "",
                              "eval": {"status": "correct" if correct else "incorrect", "compiled": True,
                                       "correct": correct, "speedup": 1.5 if correct else None, "feedback": ""}})
            records.append({"task": task, "trajectory": k, "turns": turns})
    if max(len(s.reply_ids) for s in samples) > MAX_TOKENS:
        raise SystemExit(f"a reply of the fixed batch is longer than {MAX_TOKENS} tokens")
    batch = batching.collate(samples, tokenizer.pad_token_id)
    with torch.no_grad():
        logprobs = batching.token_logprobs(batching.reply_logits(model, batch), batch["targets"],
                                           train.parse_args([]).temperature)
    rows = iter(zip(logprobs.tolist(), batch["reply_mask"].tolist()))
    for record in records:
        for turn in record["turns"]:
            row, keep = next(rows)
            turn["reply"]["logprobs"] = [lp for lp, k in zip(row, keep) if k]
    rewarded = rewards.add_rewards(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in rewarded))
    return sum(turn["advantage"] != 0 for r in rewarded for turn in r["turns"])


# ---------------------------------------------------------------- comparisons
def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare_runs(multi: Path, single: Path, initial: dict[str, torch.Tensor]) -> dict:
    """Per-step loss and gradient norm, and the final weights, of a run against the one-GPU run."""
    a, b = read_log(multi), read_log(single)
    if [m["step"] for m in a] != [m["step"] for m in b]:
        raise ValueError(f"steps {[m['step'] for m in a]} against {[m['step'] for m in b]}")
    w_a, w_b = load_weights(multi / "final"), load_weights(single / "final")
    if set(w_b) - set(w_a):
        raise ValueError(f"final weights lack {sorted(set(w_b) - set(w_a))[:3]}")
    diff = sum(float((w_a[k] - w_b[k]).double().square().sum()) for k in w_b) ** 0.5
    update = sum(float((w_b[k] - initial[k]).double().square().sum()) for k in w_b) ** 0.5
    return {"loss": [m["train/loss"] for m in a], "loss_single": [m["train/loss"] for m in b],
            "grad_norm": [m["train/grad_norm"] for m in a], "grad_norm_single": [m["train/grad_norm"] for m in b],
            "loss_rel": max(relative(x["train/loss"], y["train/loss"]) for x, y in zip(a, b)),
            "grad_norm_rel": max(relative(x["train/grad_norm"], y["train/grad_norm"]) for x, y in zip(a, b)),
            "weights_max_abs": max(float((w_a[k] - w_b[k]).abs().max()) for k in w_b),
            "update_max_abs": max(float((w_b[k] - initial[k]).abs().max()) for k in w_b),
            "weights_rel": diff / max(update, 1e-30)}


def sharded(out: Path) -> bool:
    """FSDP with SHARDED_STATE_DICT writes its checkpoint as shards; DDP writes one model file."""
    return any((out / "checkpoints").glob("step_*/pytorch_model_fsdp_*"))


# ---------------------------------------------------------------- the three parts
def offline_part(args, work: Path, watch: GpuWatch, world: int, gpus: int, rows: Checks, report: dict):
    batches = {}
    for name in args.models:
        path = MODELS[name]()
        batches[name] = (path, work / f"rollouts_{name}.jsonl")
        nonzero = write_rollouts(batches[name][1], path)
        print(f"{name}: fixed batch of 16 turn-samples, {nonzero} with a non-zero advantage", file=sys.stderr)
    launches, port, singles = {}, 29600, 0
    for name in args.models:
        for precision in args.precisions:
            base = ["--model", str(batches[name][0]), "--rollouts", str(batches[name][1]), "--lr", str(LR),
                    "--max-tokens", str(MAX_TOKENS),
                    "--tasks-per-step", "3", "--micro-batch-size", "2",
                    "--bf16" if precision == "bf16" else "--no-bf16"]
            for strategy in [None, *args.strategies]:
                tag = f"offline-{name}-{precision}-{strategy or 'single'}"
                gpu = None
                if gpus and strategy is None:  # the one-GPU runs take the GPUs in turn
                    gpu, singles = singles % gpus, singles + 1
                launches[tag] = train_launch(tag, strategy, world, base, work, port, gpu)
                port += 1
    run_wave(list(launches.values()), args.launch_timeout_s, "offline runs")
    shards = {tag: sharded(launch.out) for tag, launch in launches.items()}
    for launch in launches.values():  # 8 GB a 0.5B run (optimizer state too), and not compared
        shutil.rmtree(launch.out / "checkpoints", ignore_errors=True)
    for name in args.models:
        initial = load_weights(Path(batches[name][0]))
        for precision in args.precisions:
            single = launches[f"offline-{name}-{precision}-single"]
            for strategy in args.strategies:
                launch = launches[f"offline-{name}-{precision}-{strategy}"]
                check = f"offline {name} {precision}: {strategy} x{world} = 1 process"
                if single.returncode or launch.returncode:
                    rows.add(check, False, failure(single if single.returncode else launch))
                    continue
                try:
                    numbers = compare_runs(launch.out, single.out, initial)
                except (OSError, ValueError) as error:  # no log or weights, other steps, missing tensors
                    rows.add(check, False, str(error))
                    continue
                tol = TOLERANCES[precision]
                ok = numbers["loss_rel"] <= tol["loss"] and numbers["grad_norm_rel"] <= tol["grad_norm"] \
                    and numbers["weights_rel"] <= tol["weights"]
                text = (f"loss rel {numbers['loss_rel']:.1e} (tol {tol['loss']:.0e}), grad norm rel "
                        f"{numbers['grad_norm_rel']:.1e} (tol {tol['grad_norm']:.0e}), weights rel "
                        f"{numbers['weights_rel']:.1e} (tol {tol['weights']:.0e}; max abs "
                        f"{numbers['weights_max_abs']:.1e}, update max {numbers['update_max_abs']:.1e})")
                if strategy == "fsdp":
                    numbers["sharded"] = shards[launch.tag]
                    ok = ok and numbers["sharded"]
                    text += ", sharded" if numbers["sharded"] else ", NOT sharded (FSDP fell back to DDP)"
                placed, where = placement_check(watch, launch.tag, world, numbers)
                ok, text = ok and placed, text + where
                rows.add(check, ok, text)
                report.setdefault("offline", {})[launch.tag] = {**numbers, "seconds": launch.seconds}
        if len(args.precisions) == 2:  # how far bf16 alone moves one GPU's run
            fp32, bf16 = (launches[f"offline-{name}-{p}-single"] for p in ("fp32", "bf16"))
            if not (fp32.returncode or bf16.returncode):
                try:
                    numbers = compare_runs(bf16.out, fp32.out, initial)
                except (OSError, ValueError) as error:
                    rows.add(f"offline {name}: bf16 against fp32, 1 process", False, str(error))
                    continue
                report.setdefault("offline", {})[f"offline-{name}-bf16-vs-fp32-single"] = numbers
                rows.add(f"offline {name}: bf16 against fp32, 1 process (for scale)", None,
                         f"loss rel {numbers['loss_rel']:.1e}, grad norm rel {numbers['grad_norm_rel']:.1e}, "
                         f"weights rel {numbers['weights_rel']:.1e}")


def online_part(args, work: Path, watch: GpuWatch, world: int, rows: Checks, report: dict):
    launches, port = {}, 29700
    for name in args.models:
        model = MODELS[name]()
        for strategy in args.strategies:
            argv = ["--model", model, "--steps", "2", "--tasks-per-step", str(world), "--n-trajectories", "2",
                    "--turns", "2", "--max-tokens", "64"]
            launches[name, strategy] = train_launch(f"online-{name}-{strategy}", strategy, world, argv, work, port)
            port += 1
    run_wave(list(launches.values()), args.launch_timeout_s, "online runs")
    for (name, strategy), launch in launches.items():
        check = f"online {name} {strategy} x{world}: 2 steps"
        if launch.returncode:
            rows.add(check, False, failure(launch))
            continue
        log = read_log(launch.out)
        ok = [m["step"] for m in log] == [1, 2] and all(m["samples"] == world * 2 * 2 for m in log)
        numbers = {"steps": len(log), "samples": [m["samples"] for m in log],
                   "compiled": [m["reward/compiled"] for m in log], "rollout_s": [m["time/rollout_s"] for m in log],
                   "update_s": [m["time/update_s"] for m in log], "seconds": launch.seconds}
        text = (f"{len(log)} steps of {log[-1]['samples']} samples, rollout {sum(numbers['rollout_s']):.0f} s, "
                f"update {sum(numbers['update_s']):.0f} s, compiled {max(numbers['compiled']):.0%}")
        logged = log[0].get("placement_per_rank")  # each rank's device and evaluation GPUs, where train.py logs them
        if logged:
            numbers["logged_placement"] = logged
            text += f", logged {logged}"
            if watch.available:
                ok = ok and logged == [{"device": f"cuda:{r}", "eval_gpus": [r]} for r in range(world)]
        placed, where = placement_check(watch, launch.tag, world, numbers)
        ok, text = ok and placed, text + where
        rows.add(check, ok, text)
        report.setdefault("online", {})[launch.tag] = numbers


def eval_records(kernels: list[str], copies: int) -> list[dict]:
    library = {r["solution"]: r for r in library_records(ROOT / "solutions" / "cuda")}
    missing = [k for k in kernels if k not in library]
    if missing:
        raise SystemExit(f"--eval-kernels: no solutions/cuda/{missing[0]}.py")
    return [{**library[k], "code": f"# copy {i}\n" + library[k]["code"]} for k in kernels for i in range(copies)]


def start_warmup(args, work: Path) -> tuple[subprocess.Popen, Path]:
    """evaluate.py on one copy of each kernel, into this run's build folder: every extension gets built."""
    source, out = work / "warmup.jsonl", work / "warmup_results.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in eval_records(args.eval_kernels, 1)))
    process = subprocess.Popen([sys.executable, str(ROOT / "evaluate.py"), str(source), "-o", str(out),
                                "--build-dir", str(work / "builds"), "--no-progress"], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=open(work / "warmup.log", "w"),
                               env={**os.environ, TAG: "evaluate-warmup"}, start_new_session=True)
    return process, out


def evaluate_part(args, work: Path, watch: GpuWatch, gpus: int, warmup, rows: Checks, report: dict):
    process, warm_out = warmup
    started = time.perf_counter()
    if process.wait() != 0:
        rows.add("evaluate: build warm-up", False, f"exit {process.returncode} (log: warmup.log in the work folder)")
        return
    warm = [json.loads(line)["eval"]["status"] for line in warm_out.read_text().splitlines()]
    print(f"build warm-up done ({time.perf_counter() - started:.0f} s waited): {warm}", file=sys.stderr)
    records = eval_records(args.eval_kernels, args.eval_copies)
    runs = {}
    for devices in ([0], list(range(gpus))):
        cfg = ev.EvalConfig(device="cuda", gpus=devices, build_dir=str(work / "builds"))
        start, clock = time.time(), time.perf_counter()
        results = ev.evaluate(records, cfg)
        wall = time.perf_counter() - clock
        runs[len(devices)] = {"wall_s": wall, "kernels_per_min": len(records) / wall * 60,
                              "statuses": [r["status"] for r in results],
                              "gpus_seen": watch.gpus_between("evaluate", start, time.time()),
                              "check_and_time_s": sum(r["time_s"].get("correctness", 0) + r["time_s"].get("timing", 0)
                                                      for r in results) / len(results)}
    one, all_ = runs[1], runs[gpus]
    ratio = all_["kernels_per_min"] / one["kernels_per_min"]
    correct = all(s == "correct" for run in runs.values() for s in run["statuses"])
    spread = one["gpus_seen"] == [0] and all_["gpus_seen"] == list(range(gpus))
    report["evaluate"] = {"candidates": len(records), "kernels": args.eval_kernels, "copies": args.eval_copies,
                          "warmup_statuses": warm, "runs": runs, "ratio": ratio}
    rows.add(f"evaluate: {gpus} GPUs against 1, {len(records)} candidates", correct and spread and ratio >= 1.5,
             f"1 GPU {one['kernels_per_min']:.1f}/min ({one['wall_s']:.0f} s), {gpus} GPUs "
             f"{all_['kernels_per_min']:.1f}/min ({all_['wall_s']:.0f} s), ratio {ratio:.2f}x (pass: >= 1.5); "
             f"GPUs seen {one['gpus_seen']} / {all_['gpus_seen']}; all correct: {correct}")


# ---------------------------------------------------------------- main
def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", choices=["offline", "online", "evaluate"],
                   default=["offline", "online", "evaluate"], help="which parts to run")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS),
                   help="tiny: the 2-layer model; qwen2-0.5b: random weights in Qwen2-0.5B's shape")
    p.add_argument("--strategies", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                   help="launch configs (configs/<name>.yaml) compared with one process")
    p.add_argument("--precisions", nargs="+", choices=list(TOLERANCES), default=list(TOLERANCES),
                   help="offline runs in fp32 (--no-bf16) and/or bf16 (--bf16)")
    p.add_argument("--num-processes", type=int, default=None,
                   help="processes per multi-process run (default: the visible GPUs, 2 without GPUs)")
    p.add_argument("--eval-kernels", nargs="+", default=EVAL_KERNELS,
                   help="solutions/cuda files (level/stem.status_what) making up the evaluation set")
    p.add_argument("--eval-copies", type=int, default=2, help="copies of each kernel in the evaluation set")
    p.add_argument("--launch-timeout-s", type=float, default=150,
                   help="a training run still going after this many seconds is stopped (and fails)")
    p.add_argument("--work-dir", default=None,
                   help="keep the runs here (default: a temporary folder under runs/, removed at the end)")
    p.add_argument("--out", default=None, help="write every number to this JSON file")
    args = p.parse_args()

    gpus = torch.cuda.device_count()
    world = args.num_processes or gpus or 2
    if not gpus and "fsdp" in args.strategies and {"offline", "online"} & set(args.parts):
        raise SystemExit("FSDP needs GPUs: without them accelerate runs configs/fsdp.yaml as plain DDP; "
                         "pass --strategies ddp")
    if "evaluate" in args.parts and gpus < 2:
        raise SystemExit(f"the evaluation part compares 1 GPU with all of them and {gpus} are visible")
    if world < 2 or (gpus and world > gpus):
        raise SystemExit(f"--num-processes {world}: need at least 2 and at most the {gpus} visible GPUs")
    if args.eval_copies < 1:
        raise SystemExit("--eval-copies must be at least 1")

    (ROOT / "runs").mkdir(exist_ok=True)  # on the repository's disk: the 0.5B runs write ~50 GB
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="multi_gpu-", dir=ROOT / "runs"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        raise SystemExit(f"--work-dir {work} is not empty")
    watch = GpuWatch()
    report = {"machine": {"gpus": [row[0] for row in watch.query("gpu=name")] if watch.available else [],
                          "cpus": os.cpu_count(),
                          "python": platform.python_version(), "torch": torch.__version__,
                          "accelerate": __import__("accelerate").__version__,
                          "transformers": __import__("transformers").__version__},
              "processes": world, "tolerances": TOLERANCES, "lr": LR, "seconds": {}}
    print(f"{gpus} GPUs, {os.cpu_count()} cores, {world} processes per run; runs in {work}", file=sys.stderr)
    os.environ[TAG] = "evaluate"  # for the evaluation children started from this process
    rows, started = Checks(), time.perf_counter()
    warmup = start_warmup(args, work) if "evaluate" in args.parts else None
    try:
        for part in args.parts:
            clock = time.perf_counter()
            if part == "offline":
                offline_part(args, work, watch, world, gpus, rows, report)
            elif part == "online":
                online_part(args, work, watch, world, rows, report)
            else:
                evaluate_part(args, work, watch, gpus, warmup, rows, report)
            report["seconds"][part] = time.perf_counter() - clock
            report["checks"] = [{"check": c, "pass": ok, "numbers": text} for c, ok, text in rows]
            if args.out:  # after every part, so a run cut short keeps what it measured
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(report, indent=1))
    finally:
        watch.stop()
        if warmup and warmup[0].poll() is None:
            stop(warmup[0])
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    report["seconds"]["total"] = time.perf_counter() - started
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))

    width = max(len(c) for c, _, _ in rows)
    print(f"\n| {'check':<{width}} | result | numbers |\n|{'-' * (width + 2)}|--------|---------|")
    for check, ok, text in rows:
        print(f"| {check:<{width}} | {verdict(ok):<6} | {text} |")
    print("\nseconds: " + ", ".join(f"{k} {v:.0f}" for k, v in report["seconds"].items()))
    failed = [c for c, ok, _ in rows if ok is False]
    if failed:
        raise SystemExit(f"{len(failed)} of {len(rows)} checks failed: " + "; ".join(failed))


if __name__ == "__main__":
    main()
