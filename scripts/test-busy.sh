#!/usr/bin/env bash
# The fast tier on a busy machine, in a random order: one busy loop per CPU keeps every core taken
# (as other work would) while `scripts/test.sh --fast` runs with pytest-randomly. Tests that need
# speed must assert a verdict's reason, not a wall-clock budget; this run is how we know they do.
#   sudo scripts/test-busy.sh [pytest args]
# pytest-randomly prints its seed at the top ("Using --randomly-seed=N"); repeat that order with
#   sudo scripts/test-busy.sh --randomly-seed=N    (or: scripts/test.sh --fast -p randomly --randomly-seed=N)
set -euo pipefail
cd "$(dirname "$0")/.."
loops=()
stop() { for p in "${loops[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop EXIT
for _ in $(seq "$(nproc)"); do
  ( while :; do :; done ) &
  loops+=($!)
done
echo "test-busy.sh: ${#loops[@]} busy loop(s) on $(nproc) CPU(s): ${loops[*]}"
scripts/test.sh --fast -p randomly "$@"
