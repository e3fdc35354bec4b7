#!/bin/bash
# Hot reload under load on the H200, in one device call (docs/perf/README.md, "Reload under load"):
#   device tool: run(kind="nvidia-h200", carry=[".whl"], command="bash bench/reload_h200.sh")
# .whl/ holds the wheels the GPU machine lacks: nvidia-pytriton 0.7.0, tritonclient 2.73.0,
# python-rapidjson, pyroute2 (tests/gpu/RESULTS-multi.md says how they were downloaded).
# Writes $OUT/reload.json (the record), $OUT/run.log and the server's log tail.
OUT=${OUT:-/tmp/hkgpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cleanup() {   # the server this script's apply started, by its pid
  for p in $(python3 -c 'import sys; sys.path.insert(0, "bench"); import reload_h200 as r; print(*r.server_pids())' 2>/dev/null); do
    kill -TERM "$p"; done
  sleep 3
  # what the script's applies recorded goes too (a journal left behind refuses the next bench's apply)
  python3 -m hkgpu_tune rollback --state-dir /tmp/hkgpu-reload/state >/dev/null 2>&1; echo "rollback rc=$?"
  ps -eo pid,args | grep -i '[n]vidia-cuda-mps' || echo NO-MPS-LEFT
}
trap cleanup EXIT
date -u; nvidia-smi -L; nproc
nvidia-smi --query-gpu=persistence_mode,compute_mode,clocks.applications.graphics,power.limit --format=csv
python3 -m pip install -q --no-deps --no-index --no-compile .whl/*.whl 2>&1 | tail -2
python3 -c 'import importlib.util as u, tritonclient.grpc, torch; assert u.find_spec("pytriton"); print("deps ok", torch.__version__)'
rm -rf /tmp/hkgpu-reload
timeout ${RELOAD_S:-560} python3 bench/reload_h200.py --out "$OUT" "$@"; echo "reload rc=$?"
tail -120 /tmp/hkgpu-reload/run/tritonserver.log > "$OUT/tritonserver-tail.log" 2>/dev/null
grep -h -i -E 'torch engine|error|captur|unload|load' /tmp/hkgpu-reload/run/tritonserver.log 2>/dev/null | tail -80 > "$OUT/tritonserver-engine.log"
nvidia-smi --query-gpu=persistence_mode,compute_mode,clocks.applications.graphics,power.limit --format=csv
