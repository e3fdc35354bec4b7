#!/usr/bin/env bash
# Install hkgpu-tune and everything it and its tests use on a Debian host, then run the main job.
#   sudo scripts/install.sh            install + `hkgpu-tune verify` with the default profile
#   sudo scripts/install.sh --no-verify
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then echo "install.sh: run as root (sudo)" >&2; exit 1; fi

export DEBIAN_FRONTEND=noninteractive
pkgs=$(grep -v '^\s*#' scripts/apt-packages.txt | tr '\n' ' ')
if ! dpkg -s $pkgs >/dev/null 2>&1; then
  apt-get update -qq
  # Debian starts a package's services at install (prometheus on :9090, node_exporter on :9100):
  # the tests run their own on free loopback ports, so keep these from starting here
  rcd=/usr/sbin/policy-rc.d; own_rcd=
  if [ ! -e "$rcd" ]; then printf '#!/bin/sh\nexit 101\n' > "$rcd"; chmod 755 "$rcd"; own_rcd=1; fi
  rc=0; apt-get install -y -qq --no-install-recommends $pkgs >/dev/null || rc=$?
  [ -n "$own_rcd" ] && rm -f "$rcd"
  [ "$rc" -eq 0 ] || exit "$rc"
fi

PY=${PYTHON:-python3}
# Debian's own Python is externally managed (PEP 668): use a venv that still sees its packages
if "$PY" -c 'import sys, sysconfig, os; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
  PREFIX=${HKGPU_PREFIX:-/opt/hkgpu-tune}
  [ -x "$PREFIX/bin/python" ] || "$PY" -m venv --system-site-packages "$PREFIX"
  PY="$PREFIX/bin/python"
  ln -sf "$PREFIX/bin/hkgpu-tune" /usr/local/bin/hkgpu-tune
fi
"$PY" -m pip install -q --disable-pip-version-check -e '.[test]'
echo "$PY" > .python-path
scripts/install-docs.sh "$PY"     # man page (section 8) and shell completion

if [ "${1:-}" != "--no-verify" ]; then
  # the main job: verify this machine against the default profile (exit 2 = drift found)
  rc=0; "$PY" -m hkgpu_tune verify || rc=$?
  echo "hkgpu-tune verify exited $rc (0 ok, 2 drift, 1 error)"
  [ "$rc" -ne 1 ]
fi
