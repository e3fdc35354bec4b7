#!/usr/bin/env bash
# Run the whole test suite (as root: the integration tests build network namespaces).
#   sudo scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh --no-verify
PY=$(cat .python-path)
set +e
"$PY" -m pytest -ra -p no:cacheprovider "$@"
rc=$?
[ "$rc" -eq 5 ] && { echo "test.sh: no tests ran" >&2; exit 1; }
exit $rc
