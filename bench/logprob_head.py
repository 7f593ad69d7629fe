"""The output layer alone: train.py's LogprobHead function (batching.ChunkedScores) at several --logprob-chunk
sizes against the whole-logits path it replaces, forward and backward of the log-probs of N target rows,
in bf16 autocast over fp32 weights as train.py runs on a GPU. Per shape and chunk: milliseconds a call
(median of --repeats, the device synchronised around each) and the memory the call takes above its inputs,
each with its ratio to the whole-logits path's; TRL's fused LM head (trl.kernels.ChunkedLogProbFunction, log-probs
and entropy, as its GRPOTrainer asks, at its own tiles), where TRL is installed (a benchmark-only dependency);
and the floor, four bf16 matmuls of the layer's size (the forward's, its recomputation in backward, and the two
gradients).

    python bench/logprob_head.py --out results/logprob_head_h200.json       # on the GPU machine
    python bench/logprob_head.py --shapes 64:32:300 --chunks 8 16            # toy sizes, on a CPU

Shapes are ROWS:HIDDEN:VOCABULARY; the defaults are a 4,096- and a 16,384-token reply at Qwen2-0.5B's
output layer and a 4,096-token one at Qwen2.5-7B's. Memory is torch's peak GPU allocation (null on a CPU).
"""
import argparse
import importlib.util
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

from kevin import batching  # noqa: E402

TEMPERATURE = 0.9


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=["4096:896:151936", "16384:896:151936", "4096:3584:152064"],
                   help="ROWS:HIDDEN:VOCABULARY of each measurement")
    p.add_argument("--chunks", nargs="+", type=int, default=[1024, 2048, 4096, 8192],
                   help="--logprob-chunk sizes to time")
    p.add_argument("--repeats", type=int, default=5, help="timed calls a measurement (after 2 to warm up)")
    p.add_argument("--out", help="write the rows to this JSON file")
    args = p.parse_args(argv)
    for shape in args.shapes:
        parts = shape.split(":")
        if len(parts) != 3 or not all(x.isdigit() and int(x) > 0 for x in parts):
            raise SystemExit(f"--shapes {shape}: want ROWS:HIDDEN:VOCABULARY, three positive integers")
    if min(args.chunks) < 1 or args.repeats < 1:
        raise SystemExit("--chunks and --repeats: at least 1")
    return args


def measure(call, device: torch.device, repeats: int) -> tuple[float, float | None]:
    """(median milliseconds, GiB above what was allocated before) of `call`."""
    cuda = device.type == "cuda"
    for _ in range(2):
        call()
    times = []
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30 if cuda else None
    return statistics.median(times), peak


def calls(rows: int, hidden: int, vocabulary: int, chunks: list[int], device: torch.device) -> dict:
    """Each way of computing the loss, forward and backward, on the same inputs (gradients cleared after)."""
    g = torch.Generator(device=device).manual_seed(0)
    hidden_states = torch.randn(rows, hidden, device=device, generator=g).requires_grad_()
    weight = (torch.randn(vocabulary, hidden, device=device, generator=g) * 0.02).requires_grad_()
    targets = torch.randint(0, vocabulary, (rows,), device=device, generator=g)
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda")

    def backward(logprobs):
        logprobs.sum().backward()
        hidden_states.grad = weight.grad = None

    def whole_logits():
        with autocast:
            logits = torch.nn.functional.linear(hidden_states, weight)
        backward(batching.token_logprobs(logits, targets, TEMPERATURE))

    def head(chunk):
        def call():
            with autocast:
                scores = batching.ChunkedScores.apply(hidden_states, weight, None, targets, TEMPERATURE, chunk)
            backward(scores[:, 0])
        return call

    def trl_head():
        from trl.kernels import ChunkedLogProbFunction
        from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

        with autocast:
            logprobs, *_ = ChunkedLogProbFunction.apply(hidden_states, weight, None, targets, TEMPERATURE,
                                                        _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, ("log_probs", "entropy"))
        backward(logprobs)

    def four_matmuls():
        low = torch.bfloat16 if device.type == "cuda" else torch.float32
        a, b = hidden_states.detach().to(low), weight.detach().to(low)
        logits = a @ b.t()
        logits = a @ b.t()
        logits @ b, logits.t() @ a

    paths = {"whole logits": whole_logits, **{f"chunk {c}": head(c) for c in chunks}}
    if importlib.util.find_spec("trl"):
        paths["TRL fused head"] = trl_head
    return {**paths, "4 matmuls": four_matmuls}


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    print("| rows | hidden | vocabulary | path | ms | ratio | GiB above inputs | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        n, hidden, vocabulary = map(int, shape.split(":"))
        measured = {}
        for name, call in calls(n, hidden, vocabulary, args.chunks, device).items():
            try:
                measured[name] = measure(call, device, args.repeats)
            except torch.OutOfMemoryError:
                measured[name] = (None, None)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        base_ms, base_gib = measured["whole logits"]
        for name, (ms, gib) in measured.items():
            speed = base_ms / ms if base_ms and ms else None
            memory = gib / base_gib if base_gib and gib is not None else None
            rows.append({"rows": n, "hidden": hidden, "vocabulary": vocabulary, "path": name, "ms": ms,
                         "gib": gib, "speedup_vs_whole": speed, "memory_vs_whole": memory, "device": device.type})
            print(f"| {n} | {hidden} | {vocabulary} | {name} | {fmt(ms, '.2f')} | {fmt(speed, '.2f')}x | "
                  f"{fmt(gib, '.2f')} | {fmt(memory, '.2f')}x |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


if __name__ == "__main__":
    main()
