#!/bin/bash
# On a lent GPU machine (python3 with torch, triton and cuda-bindings, no
# network), from the repository root: the environment, the GPU tests and the
# kernels benchmark, everything written under $OUT (default out/gpu).
# The top-level source folders are linked under planner/ so that the tree
# imports without an install.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
for d in kernels solvers adapters; do ln -sfn "../$d" "planner/$d"; done
export PYTHONPATH=$PWD
{
  date -u; nvidia-smi; uname -a; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); print(torch.cuda.get_device_properties(0))"
  python3 -m pip show cuda-bindings 2>/dev/null | grep -E "^(Name|Version)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_gpu.py --timeout 60 2>&1 | tee "$OUT/test_gpu.log" | tail -30
timeout 330 python3 -m planner.bench.kernels_gpu --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -60
status=${PIPESTATUS[0]}
for d in kernels solvers adapters; do rm -f "planner/$d"; done
exit "$status"
