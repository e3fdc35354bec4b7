"""First-request latency after an idle minute, with and without keep-warm traffic, on the GPU.
In process (ResNet-50 fp16, batch 1, torchvision random weights): what the GPU and the CUDA
runtime lose while idle, without a server in between. Keep-warm: one batch-1 request every
PERIOD seconds during the idle minute (what `hkgpu-tune keepwarm` sends to a served model).
    python3 bench/keepwarm_h200.py [IDLE_S] [REPEATS] [PERIOD_S]
"""
import json, statistics, sys, threading, time
import torch, torchvision
import pynvml as nv
idle, reps, period = (float(a) for a in (sys.argv[1:] + ["60", "3", "5"][len(sys.argv) - 1:]))
nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0)
m = torchvision.models.resnet50().eval().half().cuda().to(memory_format=torch.channels_last)
x = torch.randn(1, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
def once():
    t = time.perf_counter()
    with torch.inference_mode():
        m(x); torch.cuda.synchronize()
    return (time.perf_counter() - t) * 1000
for _ in range(50): once()
warm = statistics.median(once() for _ in range(50))
out = {"gpu": nv.nvmlDeviceGetName(h), "idle_s": idle, "period_s": period, "warm_median_ms": round(warm, 3), "runs": []}
for r in range(int(reps)):
    for mode in ("idle", "keepwarm"):
        for _ in range(20): once()
        stop = threading.Event()
        def loop():
            while not stop.wait(period): once()
        th = threading.Thread(target=loop) if mode == "keepwarm" else None
        if th: th.start()
        time.sleep(idle)
        stop.set()
        if th: th.join()
        sm = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM); ps = nv.nvmlDeviceGetPerformanceState(h)
        first = once(); second = once()
        out["runs"].append({"mode": mode, "first_ms": round(first, 3), "second_ms": round(second, 3),
                            "sm_mhz_before": sm, "pstate_before": ps})
        print(json.dumps(out["runs"][-1]), flush=True)
for mode in ("idle", "keepwarm"):
    f = [x["first_ms"] for x in out["runs"] if x["mode"] == mode]
    out[mode + "_first_median_ms"] = round(statistics.median(f), 3)
print(json.dumps(out))
