#!/usr/bin/env bash
# Run the test suite (as root: the integration tests build network namespaces).
#   sudo scripts/test.sh [pytest args]          the whole suite (CI)
#   sudo scripts/test.sh --fast [pytest args]   the fast tier: unit, hostile and recorded-fixture
#                                               tests not marked slow (docs/testing.md)
# The whole suite with no arguments runs tests/vm (emulated guests: mostly waiting on the
# emulator) in a second pytest beside the rest, and prints its output after; HKGPU_TEST_SERIAL=1
# runs them in one pytest instead.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh --no-verify
PY=$(cat .python-path)
FAST=(tests/unit tests/hostile tests/gpu_unit)   # as tests/slow_check.py FAST_TIER
PYTEST=("$PY" -m pytest -ra -p no:cacheprovider --durations=30)   # the 30 slowest: where CI time goes
args=()
if [ "${1:-}" = "--fast" ]; then shift; args=(-m "not slow" "${FAST[@]}"); fi
ran() {   # pytest's exit code; 5 (no tests ran) is a failure
  [ "$1" -eq 5 ] && { echo "test.sh: no tests ran${2:+ in $2}" >&2; return 1; }
  return "$1"
}
set +e
if [ $# -eq 0 ] && [ ${#args[@]} -eq 0 ] && [ "${HKGPU_TEST_SERIAL:-0}" != 1 ]; then
  vmlog=$(mktemp /tmp/hkgpu-test-vm.XXXXXX)
  "${PYTEST[@]}" tests/vm >"$vmlog" 2>&1 &
  vm=$!
  "${PYTEST[@]}" --ignore=tests/vm
  rest=$?
  wait "$vm"
  vmrc=$?
  echo "================ tests/vm (run beside the rest; exit code $vmrc) ================"
  cat "$vmlog"
  rm -f "$vmlog"
  ran "$rest" "the suite"; rest=$?
  ran "$vmrc" "tests/vm"; vmrc=$?
  [ "$rest" -eq 0 ] && [ "$vmrc" -eq 0 ]
  exit $?
fi
"${PYTEST[@]}" "${args[@]}" "$@"
ran $?
