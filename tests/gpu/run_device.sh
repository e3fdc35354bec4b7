#!/bin/bash
# Everything the H200 run records, in one call (the device tool's $OUT comes back).
# Reads settings before and after: nothing here may change a GPU setting.
OUT=${OUT:-/tmp/hkgpu-out}; mkdir -p $OUT
exec > >(tee $OUT/run.log) 2>&1
set -x
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
date -u
ps -eo pid,ppid,stat,args | grep -i [m]ps || echo NO-MPS-AT-START
python3 -c 'import yaml, psutil, rich, pynvml, pytest; print("deps ok", yaml.__version__, pynvml.__file__)'
python3 -c 'import pyroute2' 2>&1 | tail -1
S=persistence_mode,compute_mode,mig.mode.current,ecc.mode.current,power.limit,clocks.applications.graphics,clocks.applications.memory
nvidia-smi --query-gpu=$S --format=csv > /tmp/settings-before.csv
P=tests/fixtures/gpu/profile-h200.yaml
python3 -m hkgpu_tune facts --only gpu,mps,affinity --json -p $P > $OUT/h200.json; echo facts rc=$?
python3 tests/gpu/record_h200.py $OUT
python3 -m hkgpu_tune plan --only gpu,mps -p tests/fixtures/gpu/profile-drift.yaml; echo plan rc=$?
python3 -m hkgpu_tune apply --dry-run --only gpu,mps -p tests/fixtures/gpu/profile-drift.yaml --json > $OUT/dry-run.json; echo dry-run rc=$?
python3 -m hkgpu_tune placement --gpu 0
# MPS through the CLI (no systemd here): start, status, verify everything, stop
python3 -m hkgpu_tune mps start -p $P; echo mps start rc=$?
python3 -m hkgpu_tune mps status -p $P --json; echo mps status rc=$?
python3 -m hkgpu_tune verify --only gpu,mps,affinity -p $P; echo verify rc=$?
python3 -m hkgpu_tune verify --only gpu,mps,affinity -p $P --json > $OUT/verify.json
python3 -m hkgpu_tune mps stop -p $P; echo mps stop rc=$?
python3 -m hkgpu_tune mps status -p $P; echo mps status rc=$?
python3 -m pytest -m gpu tests/gpu -v -s -rs -p no:cacheprovider 2>&1 | tee $OUT/pytest.txt
python3 -m pytest tests/gpu_unit -q -rs -p no:cacheprovider -k "not real_kernel" 2>&1 | tail -5
python3 bench/gpu_verify.py --runs 100 | tee $OUT/bench.json
python3 bench/gpu_verify.py --runs 100 | tee -a $OUT/bench.json
nvidia-smi --query-gpu=$S --format=csv > /tmp/settings-after.csv
cat /tmp/settings-after.csv
diff /tmp/settings-before.csv /tmp/settings-after.csv && echo SETTINGS-UNCHANGED
ps -eo pid,ppid,stat,args | grep -i [m]ps || echo NO-MPS-LEFT
