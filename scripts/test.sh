#!/usr/bin/env bash
# Run the test suite (as root: the integration tests build network namespaces).
#   sudo scripts/test.sh [pytest args]          the whole suite (CI)
#   sudo scripts/test.sh --fast [pytest args]   the fast tier: unit, hostile and recorded-fixture
#                                               tests not marked slow (docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh --no-verify
PY=$(cat .python-path)
FAST=(tests/unit tests/hostile tests/gpu_unit)   # as tests/slow_check.py FAST_TIER
args=()
if [ "${1:-}" = "--fast" ]; then shift; args=(-m "not slow" "${FAST[@]}"); fi
set +e
"$PY" -m pytest -ra -p no:cacheprovider --durations=30 "${args[@]}" "$@"   # the 30 slowest: where CI time goes
rc=$?
[ "$rc" -eq 5 ] && { echo "test.sh: no tests ran" >&2; exit 1; }
exit $rc
