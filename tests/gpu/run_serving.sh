#!/bin/bash
# The serving bench and the GPU serving tests on the H200, in one device call:
#   device tool: run(kind="nvidia-h200", carry=[".whl", "hkgpu_tune/serve/repository/_build"],
#                    command="bash tests/gpu/run_serving.sh quick|full")
# .whl/ holds the wheels the GPU machine lacks: nvidia-pytriton 0.7.0, tritonclient 2.73.0,
# python-rapidjson, pyroute2 (tests/gpu/RESULTS-multi.md says how they were downloaded).
# quick: a short bench into $OUT/quick plus tests/gpu/test_serving.py; full: the bench for docs/perf;
# apply: `apply --only triton` of the bench profile, then the bench (started by apply), then with
# $SWEEP_ARGS a sweep in what is left of the call; sweep: only the sweep;
# headline: the bench (started by apply) then tests/gpu/test_wheel_apply.py; grid: a sweep, then
# bench/sweep_grid.py over its configs; diag: bench/serve_diag.py (engine variants in-process, then serving variants with execute()'s phases).
MODE=${1:-full}
OUT=${OUT:-/tmp/hkgpu-out}; mkdir -p "$OUT"
exec > >(tee "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cleanup() {
  pkill -TERM -f 'pytriton/tritonserver/bin/tritonserver' 2>/dev/null
  ps -eo pid,args | grep -q '[n]vidia-cuda-mps-control -d' && echo quit | \
    CUDA_MPS_PIPE_DIRECTORY=/tmp/hkgpu-mps/pipe nvidia-cuda-mps-control
  ps -eo pid,args | grep -i '[n]vidia-cuda-mps' || echo NO-MPS-LEFT
}
trap cleanup EXIT
date -u; nvidia-smi -L; nproc; df -h /dev/shm | tail -1
ps -eo pid,args | grep -i '[n]vidia-cuda-mps' || echo NO-MPS-AT-START
python3 -m pip install -q --no-deps --no-index --no-compile .whl/*.whl 2>&1 | tail -2
python3 -c 'import importlib.util as u, tritonclient.grpc, aiohttp, torch, matplotlib; assert u.find_spec("pytriton"); print("deps ok", torch.__version__)'
command -v c++ g++ || echo "no C++ compiler: the hkbatch library comes from hkgpu_tune/serve/repository/_build (carried)"
python3 -c 'from hkgpu_tune.serve.repository import batch_backend as b; print("hkbatch:", b.available(), b.server_env())'
if [ "${HK_CHECKS:-0}" = 1 ]; then   # the GPU checks of the collectors, health, export and baseline
  timeout 120 python3 -m pytest -v -rs -p no:cacheprovider tests/collect/test_gpu.py tests/gpu/test_h200.py \
    tests/triton/test_gpu_placement.py tests/baseline/test_capture_parts.py::test_torch_engine_benchmark_on_a_gpu \
    > "$OUT/checks.txt" 2>&1; echo "checks rc=$?"; tail -15 "$OUT/checks.txt"
  printf 'name: gpu-only\ngpu:\n  gpus: all\n  persistence: true\n' > /tmp/hk-gpu.yaml
  mkdir -p /tmp/hk-tf; { time timeout 30 python3 -m hkgpu_tune health -p /tmp/hk-gpu.yaml; } >> "$OUT/checks.txt" 2>&1
  { time timeout 30 python3 -m hkgpu_tune export -p /tmp/hk-gpu.yaml --textfile-dir /tmp/hk-tf; } >> "$OUT/checks.txt" 2>&1
  echo "export rc=$?"; grep -c '^hkgpu' /tmp/hk-tf/hkgpu-tune.prom; grep '^hkgpu_tune_gpu' /tmp/hk-tf/hkgpu-tune.prom >> "$OUT/checks.txt"
  nvidia-smi --query-gpu=utilization.gpu,temperature.gpu,power.draw,memory.used,pcie.link.gen.current --format=csv >> "$OUT/checks.txt"
fi
# the bench profile as an operator applies it (compile off, no MPS: the issue-21 set-up)
W=/tmp/hkgpu-apply; SHIPPED=$W/profile.yaml
mkdir -p $W && sed -e 's/compile: {string_value: "true"}/compile: {string_value: "false"}/' bench/h200-resnet50.yaml \
  | sed '/^mps:/,$d' > $SHIPPED
if [ "$MODE" = apply ]; then
  # (a) `apply --only triton` of the shipped bench profile from a stopped server, its gate as shipped
  python3 -m hkgpu_tune triton stop -p $SHIPPED >/dev/null 2>&1
  T0=$SECONDS
  timeout 240 python3 -m hkgpu_tune apply --only triton -p $SHIPPED --state-dir $W/state --json > "$OUT/apply-shipped.json"
  echo "apply --only triton (shipped profile, compile off, no MPS): rc=$? in $((SECONDS - T0)) s"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("error:", d.get("error")); [print("note:", n) for n in d.get("notes", [])]' "$OUT/apply-shipped.json"
  timeout 60 python3 -m hkgpu_tune verify --only triton -p $SHIPPED | tail -12
  python3 -m hkgpu_tune triton stop -p $SHIPPED; rm -rf $W/state
  # (b, c) the headline: the tuned config started by apply with its gate, over the socket, checked
  # against the plain client at 64 and 96 in flight
  timeout ${BENCH_S:-330} python3 bench/serve_h200.py --out "$OUT" "${@:2}"; echo "bench rc=$?"
  [ -n "$SWEEP_ARGS" ] && MODE=sweep   # then the sweep, in what is left of the call
fi
if [ "$MODE" = headline ]; then
  # the headline (the tuned config started by apply with its gate, over the socket, checked against
  # the plain client), then the installed wheel applying a torch-engine model ($HKGPU_TEST_WHEEL)
  timeout ${BENCH_S:-330} python3 bench/serve_h200.py --out "$OUT" "${@:2}"; echo "bench rc=$?"
  export HKGPU_TEST_WHEEL=$(ls $PWD/.dist/hkgpu_tune-*.whl 2>/dev/null | head -1)
  timeout $((${CALL_S:-585} - SECONDS)) python3 -m pytest -m gpu tests/gpu/test_wheel_apply.py -v -rs \
    -p no:cacheprovider 2>&1 | tee "$OUT/pytest-wheel.txt"
elif [ "$MODE" = grid ]; then
  # a README-style sweep over the socket, then every config of its grid again in a longer load
  pkill -TERM -f 'pytriton/tritonserver/bin/tritonserver' 2>/dev/null; sleep 1
  T0=$SECONDS
  timeout $((${SWEEP_BUDGET:-270} + 40)) python3 -m hkgpu_tune triton sweep -p $SHIPPED "${@:2}" \
    --budget-s ${SWEEP_BUDGET:-270} --json > "$OUT/sweep.json"
  echo "sweep rc=$? in $((SECONDS - T0)) s"
  timeout $((${CALL_S:-585} - SECONDS)) python3 bench/sweep_grid.py -p $SHIPPED --sweep "$OUT/sweep.json" \
    --seconds ${GRID_S:-7.5} --out "$OUT/sweep-grid.json"; echo "grid rc=$?"
fi
if [ "$MODE" = sweep ]; then
  # a README-style sweep: over the socket, the processes sized by the sweep, >= 8 configs in 300 s
  pkill -TERM -f 'pytriton/tritonserver/bin/tritonserver' 2>/dev/null; sleep 1
  BUDGET=$(( ${CALL_S:-585} - SECONDS - 45 )); [ $BUDGET -gt 300 ] && BUDGET=300
  echo "sweep budget: $BUDGET s"; T0=$SECONDS
  timeout $((BUDGET + 40)) python3 -m hkgpu_tune triton sweep -p $SHIPPED ${SWEEP_ARGS:-"${@:2}"} \
    --budget-s $BUDGET --json > "$OUT/sweep.json"
  echo "sweep rc=$? in $((SECONDS - T0)) s"
  python3 -c 'import json,sys; sys.path.insert(0, "."); from hkgpu_tune.serve.measuring import sweep, sweep_out as s; d=json.load(open(sys.argv[1])); print(d["seconds"], "s,", len(d["points"]), "configs measured,", len(d["skipped"]), "skipped; best:", (d["best"] or {}).get("label"), (d["best"] or {}).get("best", {}) and {k: d["best"]["best"][k] for k in ("img_s", "p99_ms", "concurrency")}, "confirmed", (d["best"] or {}).get("confirmed")); print("check:", json.dumps(d.get("check"))); [print(p["label"], (p["best"] or {}).get("img_s"), (p["best"] or {}).get("p99_ms"), (p["best"] or {}).get("concurrency"), p["error"][:80]) for p in d["points"]]' "$OUT/sweep.json"
elif [ "$MODE" = diag ]; then
  timeout ${DIAG_S:-570} python3 bench/serve_diag.py --out "$OUT" "${@:2}"; echo "diag rc=$?"
elif [ "$MODE" = quick ]; then
  timeout 300 python3 bench/serve_h200.py --quick --out "$OUT"; echo "bench rc=$?"
  timeout 240 python3 -m pytest -m gpu tests/gpu/test_serving.py -v -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest.txt"
elif [ "$MODE" = full ]; then
  timeout ${BENCH_S:-480} python3 bench/serve_h200.py --out "$OUT" "${@:2}"; echo "bench rc=$?"
  LEFT=$((${CALL_S:-585} - SECONDS))   # the call's time (600 s), less what the bench took
  [ "${HK_PYTEST:-1}" = 1 ] && [ $LEFT -gt 60 ] && timeout $LEFT python3 -m pytest -m gpu tests/gpu/test_serving.py -v -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest.txt"
fi
tail -80 /tmp/hkgpu-bench/run/tritonserver.log > "$OUT/tritonserver-tail.log" 2>/dev/null
grep -h -i -E 'hkbatch|torch engine|torch.compile|error' /tmp/hkgpu-bench/run/tritonserver.log 2>/dev/null | tail -60 > "$OUT/tritonserver-engine.log"
