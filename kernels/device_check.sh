#!/usr/bin/env bash
# The GPU device check of issue 13: micro-benchmarks (bandwidth, matmuls at every shipped
# model's shapes in bf16 and fp8, attention, paged KV gather), the fused entropy kernel against
# the unfused PyTorch version, and ten seconds of the bench's NVML sampler around a matmul loop.
# Writes data/kernels/<gpu>__micro__torch-<version>.json.
#
# Needs only PyTorch with CUDA, Triton and nvidia-ml-py: no vLLM, no model weights, no network.
# About two minutes on one H200; stopped at DEVICE_CHECK_TIMEOUT seconds (default 300).
# Python: $PY, else the checkout's .venv, else python3. Options: --quick, --out-dir DIR,
# --sampler-seconds S (see --help).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=$(command -v python3); fi
fi
# the package from this checkout without installing it (the device machine has no package index)
view=$(mktemp -d)
trap 'rm -rf "$view"' EXIT
.ci/package-view "$view"
export PYTHONPATH="$view${PYTHONPATH:+:$PYTHONPATH}"

limit="${DEVICE_CHECK_TIMEOUT:-300}"
timeout --signal=INT --kill-after=30 "$limit" "$PY" -m compaction_bench.kernels.devicecheck "$@"
code=$?
if [ "$code" -eq 124 ]; then
  echo "error: the device check ran past ${limit} s and was stopped; rerun with --quick" >&2
fi
exit "$code"
