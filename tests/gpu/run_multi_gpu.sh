#!/bin/bash
# The multi-GPU run (issue 6), in one device call, for any number of GPUs (1, 2, 4, 8):
#   facts -> verify of every GPU setting against this host's own values -> per-GPU placement vs
#   `nvidia-smi topo -m` -> MPS for all GPUs (start, probe, one pinned client per GPU, quit) ->
#   Triton with one instance per GPU, each pinned to its GPU's CPUs (ready, answering, gate, verify, stop).
# Everything lands in $OUT. Nothing here changes a GPU setting or resets a GPU: the settings are read
# before and after and diffed (SETTINGS-UNCHANGED); the write paths run only as dry runs.
#
#   device tool:  run(kind="nvidia-h200-x8", carry=[".whl"], command="bash tests/gpu/run_multi_gpu.sh")
#   .whl/ holds wheels the GPU machine lacks: nvidia-pytriton 0.7.0, tritonclient 2.73.0 and python-rapidjson
#   (its dependency, cp312) for Triton, pyroute2 0.9.7 for `facts` of the network subsystems (see
#   tests/gpu/RESULTS-multi.md for the pip download line); without them the Triton part is skipped.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # never NVLink multicast
export CUDA_DEVICE_ORDER=PCI_BUS_ID   # CUDA (MPS clients, Triton instances) numbers GPUs as NVML does
# The device tool brings back at most 8 files: work in a folder of our own, bring back run.log, the
# fixture candidates and one tarball of everything (collect).
FINAL=${OUT:-/tmp/hkgpu-multi-final}; OUT=/tmp/hkgpu-multi-out; rm -rf "$OUT"; mkdir -p "$OUT" "$FINAL"
exec > >(tee "$FINAL/run.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
H=tests/gpu/multi_gpu.py
P=$OUT/profile-host.yaml
hk() { python3 -m hkgpu_tune "$@"; }
step() { echo; echo "=== $* ($(date -u +%T), +$((SECONDS))s)"; }
FAIL=(); NOTES=()
live_procs() { ps -eo pid,stat,args | awk '$2 !~ /^Z/'; }   # zombies are dead: PID 1 there may not reap orphans
check() { local rc=$1; shift; if [ "$rc" -ne 0 ]; then FAIL+=("$*: rc=$rc"); echo "!!! $*: rc=$rc"; fi; }

cleanup() {   # whatever happened: Triton stopped, MPS told to quit, nothing of ours left
  [ -f "$P" ] && hk triton stop -p "$P" >/dev/null 2>&1
  [ -f "$P" ] && hk mps stop -p "$P" >/dev/null 2>&1
  CUDA_MPS_PIPE_DIRECTORY=/tmp/hkgpu-multi/mps/pipe timeout 10 nvidia-cuda-mps-control <<<quit >/dev/null 2>&1
  collect
}
collect() {
  for f in multi-gpu-facts.json multi-gpu-fixture.json multi-gpu-tree.tar.gz topo-m.txt; do
    [ -f "$OUT/$f" ] && cp "$OUT/$f" "$FINAL/"; done
  tar czf "$FINAL/all-outputs.tar.gz" -C "$OUT" . 2>/dev/null; true
}
trap cleanup EXIT
trap 'exit 143' TERM INT   # a time limit still runs the cleanup

step "host"
date -u; uname -r; nproc; nvidia-smi -L
N=$(nvidia-smi -L | grep -c '^GPU ')
echo "GPUs: $N; NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
ls /sys/devices/system/node | grep node; cat /sys/devices/system/cpu/online
ps -eo pid,args | grep -i '[n]vidia-cuda-mps' || echo NO-MPS-AT-START
python3 $H settings /tmp/hkgpu-settings-before.csv
cp /tmp/hkgpu-settings-before.csv "$OUT/settings-before.csv"

step "wheels carried in .whl (the package's dependencies the GPU machine lacks)"
HAVE_TRITON=0
if ls .whl/*.whl >/dev/null 2>&1; then   # nvidia-pytriton, tritonclient (+ python-rapidjson), pyroute2
  python3 -m pip install -q --no-deps --no-index --no-compile .whl/*.whl 2>&1 | tail -2
  python3 -c 'import importlib.util as u; from tritonclient.grpc import model_config_pb2; assert u.find_spec("pytriton")' \
    && HAVE_TRITON=1
fi
echo "HAVE_TRITON=$HAVE_TRITON"

step "profile of this host's current values"
python3 $H profile "$OUT"; check $? profile
cat "$P"

step "hkgpu-tune facts --json (all subsystems, as the issue asks)"
timeout 120 python3 -m hkgpu_tune facts --json > "$OUT/facts-all.json" 2> "$OUT/facts-all.err"; echo "facts rc=$?"; tail -3 "$OUT/facts-all.err"
step "facts of gpu,mps,affinity + the /sys,/proc tree (fixture candidate)"
python3 $H record "$OUT"; check $? record
python3 - "$OUT/multi-gpu-facts.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print("driver", d["gpu"].get("driver"))
for g in d["gpu"].get("gpus", []):
    print(f"GPU{g['index']} {g['name']} {g['pci_bus_id']} pers {g['persistence']} mode {g['compute_mode']} "
          f"mig {g['mig']} ecc {g['ecc']} P{g['pstate']} power {g['power_limit_w']} W app {g['app_clocks_mhz']} "
          f"pcie {g['pcie']} numa {g['numa_node']} cpus {len(g['cpu_affinity'] or [])} nvlink {len(g['nvlink_peers'])}")
print("nodes", d["affinity"]["nodes"], "cpus", d["affinity"]["cpus"])
EOF

step "verify every GPU setting (profile = this host's values: nothing to change)"
hk verify --only gpu -p "$P"; check $? "verify gpu"
hk verify --only gpu -p "$P" --json > "$OUT/verify-gpu.json"
step "write paths as a dry run only (a profile wanting other values): plan, nothing applied"
python3 - "$P" "$OUT/profile-drift.yaml" <<'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
g = d["gpu"]
g["persistence"] = not g["persistence"]
g["compute_mode"] = "exclusive_process" if g["compute_mode"] == "default" else "default"
if "power_limit_w" in g:
    g["power_limit_w"] -= 50
open(sys.argv[2], "w").write(yaml.safe_dump({"name": "drift", "gpu": g}, sort_keys=False))
EOF
hk apply --dry-run --only gpu -p "$OUT/profile-drift.yaml" --state-dir /tmp/hkgpu-multi/state; echo "dry-run rc=$? (2 = drift planned)"
test ! -e /tmp/hkgpu-multi/state/state.json && echo "no state file: nothing applied"

step "per-GPU placement (affinity subsystem) vs nvidia-smi topo -m"
nvidia-smi topo -m
python3 $H topo "$OUT"; check $? "affinity vs topo"
for i in $(seq 0 $((N-1))); do hk placement --gpu "$i"; done

step "MPS for all GPUs through the library: start, status, verify, one pinned client per GPU, stop"
hk mps start -p "$P"; check $? "mps start"
hk mps status -p "$P" --json | tee "$OUT/mps-status.json"; check ${PIPESTATUS[0]} "mps status"
hk verify --only gpu,mps -p "$P"; check $? "verify gpu,mps"
hk verify --only gpu,mps,affinity -p "$P" --json > "$OUT/verify.json"
hk verify --only affinity -p "$P"; echo "verify affinity rc=$? (NIC interrupts: a finding about this host, not a failure)"
timeout 300 python3 $H mps-clients "$OUT"; check $? "mps clients"
hk mps status -p "$P"
hk mps stop -p "$P"; check $? "mps stop"
hk mps status -p "$P"; echo "mps status rc=$? (2 = stopped)"
live_procs | grep -i '[n]vidia-cuda-mps' && FAIL+=("MPS process left") || echo NO-MPS-LEFT
ps -eo pid,stat,args | awk '$2 ~ /^Z/' | grep -i 'mps' && echo "(zombies above: exited, not reaped by PID 1)"

step "Triton: one instance per GPU, each pinned to its GPU's CPUs"
if [ "$HAVE_TRITON" = 1 ]; then
  # the instance-group forms in order; the first whose instances all answer, pinned, is the result
  # (the others are tried only when one fails, and each failure is kept in the log and FAIL list)
  TRITON_OK=""
  for V in gpu-dlpack gpu-numpy cpu-instances; do
    step "Triton variant $V"
    python3 $H variant "$OUT" "$V"
    hk triton start --no-gate -p "$P"; rc=$?; check $rc "triton start ($V)"
    L=/tmp/hkgpu-multi/triton/run/tritonserver.log
    [ $rc -ne 0 ] && tail -40 $L
    grep -E "model.py.*instance .* kind|successfully loaded|UNAVAILABLE|E[0-9]{4} " $L | tail -$((N+6))
    if [ $rc -eq 0 ]; then
      timeout 300 python3 $H triton "$OUT" "$V"; irc=$?
      hk triton gate -p "$P"; grc=$?
      hk verify --only triton -p "$P"; vrc=$?
      hk verify --only triton -p "$P" --json > "$OUT/verify-triton-$V.json"
      nvidia-smi --query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv,noheader
    fi
    hk triton stop -p "$P"; check $? "triton stop ($V)"
    cp $L "$OUT/tritonserver-$V.log" 2>/dev/null; rm -f $L
    live_procs | grep -E '[t]ritonserver|[t]riton_python' && FAIL+=("Triton process left ($V)") || echo NO-TRITON-LEFT
    if [ $rc -eq 0 ] && [ $irc -eq 0 ] && [ $grc -eq 0 ] && [ $vrc -eq 0 ]; then TRITON_OK=$V; break; fi
    echo "!!! Triton variant $V: start rc=$rc instances rc=${irc:-} gate rc=${grc:-} verify rc=${vrc:-}"
    NOTES+=("Triton variant $V failed: start rc=$rc instances rc=${irc:-} gate rc=${grc:-} verify rc=${vrc:-}")
  done
  echo "TRITON-RESULT: ${TRITON_OK:-no variant passed}"
  [ -n "$TRITON_OK" ] || FAIL+=("Triton: no instance-group variant answered")
else
  FAIL+=("Triton skipped: no nvidia-pytriton/tritonclient wheels in .whl (carry them)")
fi

step "settings after"
python3 $H settings /tmp/hkgpu-settings-after.csv
cp /tmp/hkgpu-settings-after.csv "$OUT/settings-after.csv"
if diff /tmp/hkgpu-settings-before.csv /tmp/hkgpu-settings-after.csv; then echo SETTINGS-UNCHANGED
else FAIL+=("GPU settings changed"); echo SETTINGS-CHANGED; fi
cleanup; trap - EXIT
live_procs | grep -iE '[n]vidia-cuda-mps|[t]ritonserver|[t]riton_python' || echo NO-MPS-OR-TRITON-LEFT
printf 'NOTE: %s\n' "${NOTES[@]}"
echo "total ${SECONDS}s"
if [ ${#FAIL[@]} -eq 0 ]; then echo "MULTI-GPU-RUN: ALL OK ($N GPUs)"; exit 0; fi
printf 'FAILED: %s\n' "${FAIL[@]}"; echo "MULTI-GPU-RUN: ${#FAIL[@]} FAILED ($N GPUs)"; exit 1
