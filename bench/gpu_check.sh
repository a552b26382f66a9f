#!/usr/bin/env bash
# The GPU check: one prepared run of evald's GPU paths on a machine with NVIDIA GPUs, for the figures in
# BENCHMARKS.md ("GPU"). It runs on a node that has PyTorch with CUDA but not evald's other dependencies
# and no network: they come as wheels in .devwheels/ (made on a networked machine with
# `bench/gpu_wheels.sh`), installed into a venv that sees the node's own torch.
#
#   bench/gpu_check.sh            # figures and logs go to $OUT (default /tmp/evald-gpu-check)
#   DEVICE=cpu SIZE=tiny bench/gpu_check.sh   # the same steps on the CPU, to try the script first
#   STEPS=engines bench/gpu_check.sh          # only the named steps (space-separated; default all)
#
# What it runs, each step with its own time limit so that one slow step leaves the others' figures:
#  1. NVML as the scheduler reads it (daemon.scheduling.resources.read_gpus: free memory, utilisation);
#  2. bench.gpu_sweep on a 1.1 B-parameter bf16 Llama written on the spot, at every tp the node allows;
#  3. `evald eval` of that checkpoint through the worker on cuda, engine deepspeed then hf;
#  4. `evald run` (SQLite) on a run folder holding it, with a GPU free-memory threshold read through
#     NVML, until its result is stored; then `evald results`;
#  5. "engines": bench.engine_gpu, continuous batching against fixed batches on long-tailed responses
#     (TinyLlama's shape, bf16, random weights built on the spot; needs only torch and transformers):
#     tokens/s of both in the same call, the fraction of the bf16 roofline, peak memory, a concurrency
#     sweep, and 512 concurrent sequences of 4,096 tokens with no out-of-memory retry. Its sizes can be
#     set with ENGINE_ARGS (e.g. "--long 1024 --hold-tokens 1024" for a short lease).
# Steps 1-4 are "nvml sweep eval run".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/evald-gpu-check}"
mkdir -p "$OUT"
WORK="$(mktemp -d /tmp/evald-gpu-XXXX)"
# The CUDA image's PyTorch lives in its own venv; elsewhere the first python3 with torch.
PY="${EVALD_GPU_PYTHON:-$( [ -x /opt/torch/.venv/bin/python3 ] && echo /opt/torch/.venv/bin/python3 || echo python3)}"
DEVICE="${DEVICE:-cuda}"
SIZE="${SIZE:-small}"
if [ "$DEVICE" = cuda ]; then DTYPE=bfloat16; THRESHOLD='min_gpu_free_memory = "8GiB"'; else
  DTYPE=float32; THRESHOLD=""; export DS_ACCELERATOR=cpu; fi

STEPS="${STEPS:-nvml sweep eval run engines}"
step() { echo; echo "=== $1 ($(date -u +%T))"; }
wants() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

step "environment"
deps=""
if [ -d .devwheels ]; then
  # Beside, not into, the image's packages: --target leaves its torch and transformers as they are.
  "$PY" -m pip install -q --no-index --no-deps --target "$WORK/deps" .devwheels/*.whl || exit 1
  deps=":$WORK/deps"
fi
export PYTHONPATH="$PWD$deps" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi -L
"$PY" -c 'import torch, deepspeed, transformers, sqlalchemy, pydantic
print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())
print("deepspeed", deepspeed.__version__, "transformers", transformers.__version__)'

if wants engines; then
  step "engines: continuous against fixed batches (bench.engine_gpu)"
  tiny=""; [ "$SIZE" = tiny ] && tiny="--tiny"
  # shellcheck disable=SC2086
  timeout "${ENGINE_TIMEOUT:-540}" "$PY" -m bench.engine_gpu $tiny ${ENGINE_ARGS:-} --json "$OUT/engines.json" 2>&1 \
    | grep -v -E "^\s*$|Warning|warn"
  echo "exit ${PIPESTATUS[0]}"
fi
wants nvml || wants sweep || wants eval || wants run || { step "done"; exit 0; }

if wants nvml; then
step "NVML through the scheduler's reader"
"$PY" -c 'from daemon.scheduling.resources import read_gpus
for g in read_gpus():
    print(g)' 2>&1
fi

if wants sweep || wants eval || wants run; then
step "checkpoint: Llama of size $SIZE, $DTYPE"
"$PY" -c "from pathlib import Path; from bench.gpu_sweep import write_checkpoint; write_checkpoint(Path('$WORK/run/checkpoint-100'), '$SIZE', '$DTYPE')"
# Written last, as the HF Trainer does: the folder is a complete Trainer checkpoint from here on.
echo '{"global_step": 100, "log_history": []}' >"$WORK/run/checkpoint-100/trainer_state.json"
du -sh "$WORK/run/checkpoint-100"

fi

if wants sweep; then
step "bench.gpu_sweep"
timeout 300 "$PY" -m bench.gpu_sweep --device "$DEVICE" --checkpoint "$WORK/run/checkpoint-100" --json "$OUT/sweep.json" 2>&1 \
  | grep -v -E "^\s*$|Warning|warn" | tail -20
fi

cat > "$WORK/evald.toml" <<EOF
[database]
url = "sqlite:///$WORK/evald.db"

[[runs]]
name = "gpu"
root = "$WORK/run"
layout = "auto"

[[tasks]]
name = "arith"
dataset = "$PWD/inference/toy/data/arith500.jsonl"
prompt_field = "problem"
answer_field = "answer"
id_field = "unique_id"
prompt_template = "{prompt}="
max_new_tokens = 64
batch_size = 64
metrics = ["accuracy", "response_length", "tokens_per_s", "peak_memory_mb", "load_s", "wall_s"]

[tasks.subset]
size = 500
seed = 0

[inference]
engine = "deepspeed"
device = "$DEVICE"
dtype = "$DTYPE"

[scheduling]
quiet_secs = 1.0
rescan_secs = 2.0
tick_secs = 0.2

[scheduling.resources]
$THRESHOLD

[daemon]
state_dir = "$WORK/state"
EOF

if wants eval; then
for engine in deepspeed hf; do
  step "evald eval on $DEVICE, engine $engine"
  timeout 180 "$PY" -m daemon --config "$WORK/evald.toml" eval --engine "$engine" --format json \
    "$WORK/run/checkpoint-100" >"$OUT/eval-$engine.json" 2>"$OUT/eval-$engine.log"
  echo "exit $?"; cat "$OUT/eval-$engine.json"; tail -5 "$OUT/eval-$engine.log"
done
fi

if wants run; then
step "evald run on $DEVICE (on cuda with an NVML threshold)"
"$PY" -m daemon --config "$WORK/evald.toml" db upgrade
timeout 200 "$PY" -m daemon --config "$WORK/evald.toml" run >"$OUT/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 1 90); do
  kill -0 "$daemon" 2>/dev/null || break
  if "$PY" -m daemon --config "$WORK/evald.toml" results --format json 2>/dev/null | grep -q accuracy; then
    break
  fi
  sleep 2
done
"$PY" -m daemon --config "$WORK/evald.toml" results 2>&1
"$PY" -m daemon --config "$WORK/evald.toml" status 2>&1 | tail -15
kill -TERM "$daemon" 2>/dev/null; wait "$daemon"
grep -E "resources|gpu|job\.(succeeded|failed)" "$OUT/daemon.log" | cut -c1-300 | tail -15
fi
step "done"
