#!/usr/bin/env bash
# Wheels of evald's dependencies that a GPU node's own Python (3.12, PyTorch with CUDA preinstalled, no
# network) lacks, for bench/gpu_check.sh: run here, on a networked machine with the project's venv.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devwheels
pick="--no-deps --only-binary=:all: --python-version ${GPU_PYTHON_VERSION:-3.12} --implementation cp"
pick="$pick --abi cp${GPU_PYTHON_VERSION:-3.12} --abi abi3 --abi none --platform manylinux2014_x86_64"
pick="$pick --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any"
pick="${pick//cp3./cp3}"
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
wanted=()
for name in alembic annotated-types APScheduler greenlet hjson latex2sympy2_extended Mako math-verify pydantic \
  pydantic_core SQLAlchemy structlog tzlocal typing-inspection watchdog psycopg psycopg-binary starlette \
  uvicorn antlr4-python3-runtime sacrebleu; do
  wanted+=("$name==$(version "$name")")
done
# shellcheck disable=SC2086
.venv/bin/pip download $pick -d .devwheels "${wanted[@]}"
# Published as source only: built here, pure Python (DeepSpeed with no prebuilt ops).
.venv/bin/pip wheel --no-deps --no-build-isolation -w .devwheels "sdnotify==$(version sdnotify)" \
  "deepspeed==$(version deepspeed)"
