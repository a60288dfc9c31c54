#!/usr/bin/env bash
# The test suite on a loaded machine: one CPU burner per core (busy loops at normal priority, competing with
# every test process for the whole run), the README's test command RUNS times in a row; prints each run's
# wall time and result. Shows that the tests hold when the host stalls processes.
#
#   bash scripts/loaded_suite.sh            # 3 runs, burners on all cores
#   RUNS=1 BURNERS=4 bash scripts/loaded_suite.sh -k replay      # extra arguments go to pytest
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
BURNERS=${BURNERS:-$(nproc)}
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq "$BURNERS"); do
    ( while :; do :; done ) &
    pids+=($!)
done
echo "loaded_suite: $BURNERS burners on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
failed=0
for run in $(seq "$RUNS"); do
    start=$(date +%s)
    .venv/bin/python -m pytest -q -n auto --dist worksteal -p no:cacheprovider "$@" > "/tmp/loaded_suite_$run.log" 2>&1
    rc=$?
    echo "loaded_suite: run $run: exit $rc in $(( $(date +%s) - start )) s: $(tail -1 "/tmp/loaded_suite_$run.log")"
    [ "$rc" = 0 ] || failed=1
done
exit $failed
