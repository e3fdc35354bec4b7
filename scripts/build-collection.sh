#!/usr/bin/env bash
# Build the Ansible collection hkgpu.tune (roles/, playbooks/, the hkgpu module) as a tarball
# that `ansible-galaxy collection install FILE` installs with no Galaxy access.
#   scripts/build-collection.sh [OUT_DIR]       default: dist/; prints the tarball's path
# In the source tree the collection's roles/ and playbooks/ are links to the repository's;
# ansible-galaxy skips links that leave the collection, so the build copies them as files.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
src=collections/ansible_collections/hkgpu/tune
PY=${PYTHON:-python3}
GALAXY=${ANSIBLE_GALAXY:-$(command -v ansible-galaxy || true)}
[ -n "$GALAXY" ] || { echo "build-collection: ansible-galaxy not found (pip install ansible-core)" >&2; exit 1; }

# one version: the collection's is the package's
"$PY" - "$src/galaxy.yml" pyproject.toml <<'PYEOF'
import sys, tomllib, yaml
galaxy = yaml.safe_load(open(sys.argv[1]))["version"]
package = tomllib.load(open(sys.argv[2], "rb"))["project"]["version"]
if galaxy != package:
    sys.exit(f"build-collection: {sys.argv[1]}: version {galaxy} differs from pyproject.toml's {package}")
PYEOF

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dst="$stage/ansible_collections/hkgpu/tune"
mkdir -p "$dst"
cp -rL "$src/." "$dst/"
# the example inventory (its README's commands start from a copy of it)
mkdir -p "$dst/inventory"
cp -rL inventory/. "$dst/inventory/"
find "$dst" \( -name __pycache__ -o -name '*.pyc' -o -name '*.retry' \) -prune -exec rm -rf {} +
# the toolkit's wheel, built from this tree: hkgpu_install ships it to the nodes (the same version)
PYTHONPATH="$PWD" "$PY" roles/hkgpu_install/files/hkgpu_ship.py --no-deps --out "$stage/wheels" >"$stage/ship.json"
"$PY" -c 'import json, shutil, sys; shutil.copy(json.load(open(sys.argv[1]))["wheel"], sys.argv[2])' \
  "$stage/ship.json" "$dst/roles/hkgpu_install/files/"
mkdir -p "$out"
"$GALAXY" collection build --force --output-path "$out" "$dst" >&2
ls "$out"/hkgpu-tune-*.tar.gz | sort -V | tail -1
