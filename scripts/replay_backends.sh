#!/usr/bin/env bash
# Side by side: the main job's replay with the target on torch eager and on onnxruntime (CPU), on held-out
# Schunk runs, one after the other on this machine; prints one table per run (a column per backend).
#
#     bash scripts/replay_backends.sh [DATA_DIR] [RUN ...]      # default: ../shared/data/schunk_lwa4p 1 11 21 31
set -eu
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data/schunk_lwa4p}
shift || true
RUNS=${*:-1 11 21 31}
OUT=${OUT:-out/replay_backends}
for n in $RUNS; do
    for backend in torch onnxruntime; do
        edgeinfer replay --log "$DATA/measurement_$n" --backend "$backend" --out "$OUT/$backend-$n" > /dev/null
    done
    python - "$OUT" "$n" <<'PY'
import json, sys
from edgeinfer.sim.report import print_table
out, n = sys.argv[1], sys.argv[2]
reports = []
for backend in ("torch", "onnxruntime"):
    r = json.load(open(f"{out}/{backend}-{n}/report.json"))
    r["label"] = backend
    reports.append(r)
print_table(reports)
PY
done
