#!/bin/bash
# `apply --only triton` of the shipped GPU bench profile (compile off, no MPS) from a stopped server,
# its gate as shipped; then the gate's load generator against the plain client at 64 and 96 in
# flight on the service apply started. One device call: run(carry=[".whl"], command="bash bench/apply_h200.sh")
OUT=${OUT:-/tmp/hkgpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/apply-run.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
trap 'python3 -m hkgpu_tune triton stop -p $P >/dev/null 2>&1; pkill -TERM -f pytriton/tritonserver/bin/tritonserver' EXIT
date -u; nvidia-smi -L; git rev-parse --short HEAD 2>/dev/null
python3 -m pip install -q --no-deps --no-index --no-compile .whl/*.whl 2>&1 | tail -2
W=/tmp/hkgpu-apply; P=$W/profile.yaml; mkdir -p $W
sed -e 's/compile: {string_value: "true"}/compile: {string_value: "false"}/' bench/h200-resnet50.yaml | sed '/^mps:/,$d' > $P
python3 -m hkgpu_tune triton stop -p $P >/dev/null 2>&1
T0=$SECONDS
timeout ${APPLY_S:-150} python3 -m hkgpu_tune apply --only triton -p $P --state-dir $W/state --json > "$OUT/apply-shipped.json"
echo "apply rc=$? in $((SECONDS - T0)) s"
python3 - "$OUT/apply-shipped.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print("error:", d.get("error")); [print("note:", n) for n in d.get("notes", [])]
for r in (d.get("data") or {}).get("results", d.get("results", [])) if isinstance(d.get("data") or d, dict) else []:
    if "gate" in json.dumps(r):
        print(json.dumps(r)[:600])
PY
timeout 30 python3 -m hkgpu_tune verify --only triton -p $P | tail -6
timeout ${CHECK_S:-60} python3 bench/loadgen_check.py -p $P --concurrency 64,96 --seconds 5 --out "$OUT/loadgen-check.json"
echo "check rc=$?"
