#!/bin/bash
# Everything the H200 run records, in one call (the device tool's $OUT comes back).
# Reads settings before and after: nothing here may change a GPU setting.
set -x
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/hkgpu-out}; mkdir -p $OUT
date -u
python3 -c 'import yaml, psutil, rich, pynvml, pytest; print("deps ok", yaml.__version__, pynvml.__file__)'
python3 -c 'import pyroute2' 2>&1 | tail -1
S=persistence_mode,compute_mode,mig.mode.current,ecc.mode.current,power.limit,clocks.applications.graphics,clocks.applications.memory
nvidia-smi --query-gpu=$S --format=csv > $OUT/settings-before.csv
P=tests/fixtures/gpu/profile-h200.yaml
python3 -m hkgpu_tune facts --only gpu,mps,affinity --json -p $P > $OUT/h200.json; echo facts rc=$?
python3 tests/gpu/record_h200.py $OUT
python3 -m hkgpu_tune verify --only gpu,mps,affinity -p $P; echo verify rc=$?
python3 -m hkgpu_tune verify --only gpu,mps,affinity -p $P --json > $OUT/verify.json
python3 -m hkgpu_tune plan --only gpu,mps -p tests/fixtures/gpu/profile-drift.yaml; echo plan rc=$?
python3 -m hkgpu_tune apply --dry-run --only gpu,mps -p tests/fixtures/gpu/profile-drift.yaml --json > $OUT/dry-run.json; echo dry-run rc=$?
python3 -m hkgpu_tune placement --gpu 0
python3 -m pytest -m gpu tests/gpu -v -s -rs -p no:cacheprovider 2>&1 | tee $OUT/pytest.txt
python3 bench/gpu_verify.py --runs 100 | tee $OUT/bench.json
python3 bench/gpu_verify.py --runs 100 | tee -a $OUT/bench.json
nvidia-smi --query-gpu=$S --format=csv > $OUT/settings-after.csv
diff $OUT/settings-before.csv $OUT/settings-after.csv && echo SETTINGS-UNCHANGED
ps -eo pid,comm | grep -i mps || echo NO-MPS-LEFT
