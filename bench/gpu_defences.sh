#!/usr/bin/env bash
# The evaluator's defences on a GPU, each step logging to $OUT: the GPU tests (their batches of hand-written and
# adversarial kernels kept in $OUT/keep), evaluation throughput with this checkout's evaluator and with an older
# one on the same candidates (an export in .old, made beforehand, e.g. git archive 0928aec^ --prefix=.old/ | tar -x
# for the evaluator before the judge moved out of the candidate's process), the timing against a clean one
# (bench/timing_fidelity.py), whether speedups repeat across two runs, and what the runtime defences cost.
#   OUT=/tmp/def setsid nohup bash bench/gpu_defences.sh > /tmp/def.log 2>&1 < /dev/null &   # detached
#   STEPS="gpu_tests throughput_after" OUT=/tmp/def bash bench/gpu_defences.sh                 # some steps
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the logs and results}
mkdir -p "$OUT/keep" .cache
ln -sfn ../.cache .old/.cache  # the older evaluator reads the same build cache
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # kevin/ uninstalled

step() {  # step NAME COMMAND...: its output in $OUT/NAME.log, its exit status in $OUT/summary.txt (only the
    local name=$1 started=$SECONDS; shift  # steps STEPS names, where it is set)
    [[ -z ${STEPS:-} || " $STEPS " == *" $name "* ]] || return 0
    echo "== $name $(date +%T): $*" >> "$OUT/summary.txt"
    "$@" > "$OUT/$name.log" 2>&1
    echo "   exit $? after $((SECONDS - started)) s" >> "$OUT/summary.txt"
}

step gpu_tests env KEEP_RESULTS="$OUT/keep" python -m pytest -m gpu tests/ -q -p no:cacheprovider \
    -k "not ddp_and_fsdp and not zero3" --durations=20
tail -n 3 "$OUT/gpu_tests.log" >> "$OUT/summary.txt"
step throughput_after python bench/eval_throughput.py --part evaluate --save "$OUT/throughput_after.json"
step throughput_before python bench/eval_throughput.py --part evaluate --tree .old --save "$OUT/throughput_before.json"
tail -qn 1 "$OUT"/throughput_*.log >> "$OUT/summary.txt"
step timing_fidelity python bench/timing_fidelity.py --out "$OUT/timing_fidelity.json"
step repeatability python bench/repeatability.py --out "$OUT/repeatability.json"
step defence_cost_after python bench/defence_cost.py --count 10 --out "$OUT/defence_cost_after.json"
step defence_cost_before python bench/defence_cost.py --count 10 --tree .old --out "$OUT/defence_cost_before.json"
touch "$OUT/done"
