#!/usr/bin/env bash
# GPU check of the torch backend (CUDA graphs, bf16, FP8 through torch._scaled_mm) and the engine bench, in
# one command from the repository root of a bare GPU machine (no pip downloads; about 2-4 minutes):
#
#     EDGEINFER_DATA_DIR=out/schunk_heldout bash scripts/gpu_check.sh      # or: bash scripts/gpu_check.sh DIR
#
# DIR holds a copy of a few held-out Schunk runs (measurement_1, _6, _11, _16: n % 5 == 1); without one,
# calibration and parity fall back to the synthetic log and every figure says so. Default when neither is
# given: out/schunk_heldout if it exists.
# Environment: OUT (results, default out), PYTHON (default python3), N_OBS (default 100), N_ITERS (200),
# STEP_TIMEOUT_S (per step, default 120: at most about 11 minutes in all).
# Steps, each its own process so that one failure (even a poisoned CUDA context) cannot stop the others:
#   1 import check (editable install without dependencies, else a symlink tree on PYTHONPATH)
#   2 bench on cuda, torch rows with CUDA graphs          -> $OUT/bench_cuda_graphs.json   (the headline)
#     and again with single-token passes through torch.compile -> $OUT/bench_cuda_compiled.json
#   3 bench on cuda, eager rows (torch, onnxruntime)       -> $OUT/bench_cuda_eager.json
#     and the ultrafast rows (each layer of the stack vs torch eager target-only, every shipped policy; torch
#     rows with CUDA graphs, the whole greedy chunk as one graph)  -> $OUT/bench_cuda_ultrafast.json
#   4 the CUDA tests of tests/test_torch_engine.py (when pytest is installed)
#   5 bench on cpu for reference (torch, onnxruntime)      -> $OUT/bench_cpu.json
#   6 the merged table and the headline
# Every step prints its exit status; the script itself always runs to the end.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
PY=${PYTHON:-python3}
N_OBS=${N_OBS:-100}
N_ITERS=${N_ITERS:-200}
T=${STEP_TIMEOUT_S:-120}
REPO=$(pwd)

DATA=${1:-${EDGEINFER_DATA_DIR:-}}
if [ -z "$DATA" ] && [ -d .gpu_data/schunk_lwa4p ]; then DATA=.gpu_data/schunk_lwa4p; fi
if [ -n "$DATA" ]; then
    export EDGEINFER_DATA_DIR=$(cd "$DATA" 2>/dev/null && pwd || echo "$DATA")
    echo "data: EDGEINFER_DATA_DIR=$EDGEINFER_DATA_DIR ($(ls -d "$EDGEINFER_DATA_DIR"/measurement_* 2>/dev/null | wc -l) runs)"
else
    echo "data: none given (EDGEINFER_DATA_DIR unset): real data only if ../shared/data/schunk_lwa4p exists"
fi

step() {  # step NAME COMMAND...: run with a timeout, report the exit status, never stop the script
    local name=$1; shift
    echo; echo "=== $name"
    local t0=$SECONDS
    timeout "$T" "$@"
    local rc=$?
    echo "=== $name: rc=$rc ($((SECONDS - t0)) s)$([ $rc = 124 ] && echo ', TIMED OUT')"
}

echo "=== machine"
nvidia-smi -L 2>&1 || echo "nvidia-smi not available"
"$PY" - <<'EOF' 2>&1
import importlib.util, platform
print("python", platform.python_version())
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
    if torch.cuda.is_available():
        print("gpu", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0),
              "_scaled_mm", hasattr(torch, "_scaled_mm"))
except Exception as e:
    print("torch import failed:", e)
for mod in ("numpy", "onnxruntime", "rich", "pytest", "zmq", "tensorrt"):
    print(f"{mod}: {'yes' if importlib.util.find_spec(mod) else 'no'}")
EOF

echo; echo "=== install"
imports_here() {  # edgeinfer.engines importable, and from this checkout
    "$PY" -c "import edgeinfer.bench.engines as b, pathlib, sys; \
sys.exit(0 if pathlib.Path(b.__file__).resolve().parent == pathlib.Path('$REPO/engines').resolve() else 1)" 2>/dev/null
}
if imports_here; then
    echo "edgeinfer already importable from $REPO"
else
    timeout 60 "$PY" -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
    if imports_here; then
        echo "editable install OK"
    else
        # engines/, sim/ and control/ are linked into edgeinfer/, so the checkout itself is importable
        export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
        if imports_here; then echo "editable install failed; using the checkout: PYTHONPATH=$PYTHONPATH"
        else echo "ERROR: edgeinfer cannot be imported; the steps below will fail"; "$PY" -c "import edgeinfer.bench.engines"; fi
    fi
fi

BENCH=("$PY" -m edgeinfer.bench.engines --n-obs "$N_OBS" --n-iters "$N_ITERS")
step "bench cuda, CUDA graphs on" "${BENCH[@]}" --rows engines --device cuda --backends torch --cuda-graphs on \
    --json "$OUT/bench_cuda_graphs.json"
step "bench cuda, CUDA graphs on + torch.compile" "${BENCH[@]}" --rows engines --device cuda --backends torch \
    --cuda-graphs on --compile --precisions bf16,fp8,fp32 --json "$OUT/bench_cuda_compiled.json"
step "bench cuda, eager" "${BENCH[@]}" --rows engines --device cuda --backends torch,onnxruntime --cuda-graphs off \
    --json "$OUT/bench_cuda_eager.json"
step "bench cuda, ultrafast rows" "${BENCH[@]}" --rows ultrafast --ultrafast-n-obs "$N_OBS" --device cuda \
    --json "$OUT/bench_cuda_ultrafast.json"
if "$PY" -c "import pytest" 2>/dev/null; then
    step "CUDA tests" "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_torch_engine.py
else
    echo; echo "=== CUDA tests: pytest not installed, not run (graphs=eager in the bench table checks exactness)"
fi
step "bench cpu (reference)" "${BENCH[@]}" --rows engines --device cpu --backends torch,onnxruntime \
    --json "$OUT/bench_cpu.json"

# the main job on the GPU: replay a held-out run through runtime (torch fp32 on cuda) + control over ZeroMQ;
# pyzmq comes as a carried wheel (.gpu_data/pyzmq-*.whl) when the machine lacks it
if ! "$PY" -c "import zmq" 2>/dev/null && ls .gpu_data/pyzmq-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .gpu_data/pyzmq-*.whl 2>&1 | tail -2
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -n "${EDGEINFER_DATA_DIR:-}" ] && [ -d "$EDGEINFER_DATA_DIR/measurement_1" ]; then
    for prec in fp32 bf16; do
        step "replay measurement_1, torch $prec on cuda" "$PY" -m edgeinfer replay \
            --log "$EDGEINFER_DATA_DIR/measurement_1" --device cuda --precision $prec --out "/tmp/replay_cuda_$prec"
        cp "/tmp/replay_cuda_$prec/report.json" "$OUT/replay_cuda_${prec}_report.json" 2>/dev/null
    done
fi

echo; echo "=== summary"
JSONS=$(ls "$OUT"/bench_cuda_graphs.json "$OUT"/bench_cuda_compiled.json "$OUT"/bench_cuda_eager.json \
    "$OUT"/bench_cuda_ultrafast.json "$OUT"/bench_cpu.json 2>/dev/null)
if [ -n "$JSONS" ]; then
    # shellcheck disable=SC2086
    "$PY" -m edgeinfer.bench.engines --summary $JSONS
else
    echo "no bench results were written"
fi
echo "results: $OUT/bench_*.json, log: $OUT/gpu_check.log"
exit 0
