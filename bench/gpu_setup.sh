#!/usr/bin/env bash
# The GRPO-update measurements on a GPU machine that cannot download: install the carried .whl/ (DeepSpeed's
# source distribution, built here with no ops ahead: its CPU Adam compiles at first use; TRL and datasets;
# their pure-Python needs) into a target folder beside the machine's own torch, then run, each step logging
# to $OUT: ZeRO-3 with the optimizer offloaded (configs/deepspeed_zero3.yaml) for two online steps of the
# tiny model; the output layer's equality test on the GPU (its Triton kernels); bench/grpo_step.py's rows
# (--rows ROW... passed on, default all); the GPU tests.
#   OUT=/tmp/out bash bench/gpu_setup.sh                                 # everything, in this order
#   OUT=/tmp/out setsid nohup bash bench/gpu_setup.sh 0.5b:full:512 > /tmp/out/run.log 2>&1 &    # detached
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the logs and results}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT" "$SITE"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST=9.0

step() {  # step NAME COMMAND...: run it, its output in $OUT/NAME.log, its exit status in the summary
    local name=$1; shift
    echo "== $name: $*" | tee -a "$OUT/summary.txt"
    local started=$SECONDS
    "$@" > "$OUT/$name.log" 2>&1
    echo "   exit $? after $((SECONDS - started)) s" | tee -a "$OUT/summary.txt"
}

step install python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation \
    --upgrade --target "$SITE" .whl/*.whl .whl/deepspeed-*.tar.gz
step versions python3 -c "import torch, transformers, accelerate, peft, deepspeed, trl, datasets
print(torch.__version__, transformers.__version__, accelerate.__version__, peft.__version__, deepspeed.__version__,
      trl.__version__, datasets.__version__, torch.cuda.get_device_name(0))"
step zero3_tiny python3 -m accelerate.commands.launch --config_file configs/deepspeed_zero3.yaml --num_processes 1 \
    train.py --steps 2 --tasks-per-step 2 --n-trajectories 2 --turns 1 --max-tokens 64 --out "$OUT/zero3_tiny"
step logprob_head python3 -m pytest -q -p no:cacheprovider tests/test_train.py -k chunked_logprob_head  # its Triton kernels
step grpo_step python3 bench/grpo_step.py --out "$OUT/grpo_step_h200.json" ${@:+--rows "$@"}
if [ "${GPU_TESTS:-1}" = 1 ]; then  # GPU_TESTS=0: the measurements only
    step gpu_tests python3 -m pytest -m gpu tests/ -q -p no:cacheprovider
    tail -n 3 "$OUT/gpu_tests.log" >> "$OUT/summary.txt"
fi
touch "$OUT/done"
