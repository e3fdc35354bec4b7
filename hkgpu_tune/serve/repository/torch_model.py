"""The torch engine: a torchvision model in fp16 and channels_last with one CUDA graph per batch
size the batcher forms. Triton serves it through the hkbatch backend (TritonBatchModel: one call per
batch) or its Python backend (TritonPythonModel); this file is copied verbatim to
REPO/NAME/VERSION/model.py. The benches import TorchEngine from here for the in-process limit.

Config parameters (strings, set by the profile's `build:`): torchvision (e.g. resnet50), fp16,
channels_last, cuda_graphs, graph_batches ("1,2,4,..."), image_size. Random weights: the model's
cost is the point, nothing is downloaded. More, from the model's `config: {parameters: ...}`
(checked by engine_options): fold_bn (batch norm folded into the convolutions, eval only),
compile (torch.compile with inductor, one compile for every batch size, then the CUDA graphs),
compile_cache_dir (inductor's cache, so a restart compiles from it; default: inductor-cache in the
model's directory), compile_budget_s (a compile slower than this is logged as over the budget), copy_threads (threads
that gather a batch's requests into the pinned buffer, default 4).
A UINT8 input (pixels as a front end decodes them) is scaled to the engine's dtype on the GPU.

>>> eng = TorchEngine("resnet50", batches=[1, 8, 32], device="cuda:0")   # doctest: +SKIP
>>> eng.run(np.zeros((5, 3, 224, 224), np.float16)).shape                 # doctest: +SKIP
(5, 1000)
"""
import json
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np

try:  # inside Triton's Python backend stub only
    import triton_python_backend_utils as pb_utils
except ImportError:
    pb_utils = None


def graph_batches(max_batch: int, preferred=()) -> list[int]:
    """Powers of two and their midpoints up to max_batch, plus max_batch and the preferred sizes:
    a batch of n is padded to the next size, so at most 1/3 of the work is padding."""
    sizes = {max_batch, *[int(p) for p in preferred if 0 < int(p) <= max_batch]}
    b = 1
    while b < max_batch:
        sizes.add(b)
        if b >= 4 and b + b // 2 < max_batch:
            sizes.add(b + b // 2)
        b *= 2
    return sorted(sizes)


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
INPUT_TYPES = {"FP16": np.float16, "FP32": np.float32, "UINT8": np.uint8}
WEIGHT_FORMATS = ("state_dict", "torchscript", "export")
# measured on an H200 (issue 11): max-autotune took about 4 minutes for ResNet-50 at one batch size
AUTOTUNE_MIN_BUDGET_S = 300
# the compiled batch dimension's upper bound: one constant, so engines of any max_batch (the bench's
# in-process limit, the served model) share inductor's cache
COMPILE_MAX_BATCH = 1024


def engine_options(params: dict, input_type: str = "FP16") -> dict:
    """The engine's settings from the model config's parameters (strings); ValueError naming the
    parameter for a value it cannot use."""
    def flag(key, default):
        v = str(params.get(key, default)).strip().lower()
        if v in TRUE:
            return True
        if v in FALSE:
            return False
        raise ValueError(f"parameter {key}: {v!r} is not true or false")

    def number(key, default, lo, hi):
        v = str(params.get(key, default)).strip()
        try:
            x = float(v)
        except ValueError:
            raise ValueError(f"parameter {key}: {v!r} is not a number") from None
        if not lo <= x <= hi:
            raise ValueError(f"parameter {key}: {v} is outside {lo:g}..{hi:g}")
        return x

    itype = str(input_type).removeprefix("TYPE_")
    if itype not in INPUT_TYPES:
        raise ValueError(f"input data_type {itype}: the torch engine takes {', '.join(INPUT_TYPES)}")
    sync = str(params.get("sync", "blocking")).strip()
    if sync not in ("blocking", "spin"):
        raise ValueError(f"parameter sync: {sync!r} is not blocking or spin")
    mode = str(params.get("compile_mode", "default")).strip()
    if mode not in COMPILE_MODES:
        raise ValueError(f"parameter compile_mode: {mode!r} is not one of {', '.join(COMPILE_MODES)}")
    opts = {"fp16": flag("fp16", "true"), "channels_last": flag("channels_last", "true"),
            "cuda_graphs": flag("cuda_graphs", "true"), "fold_bn": flag("fold_bn", "false"),
            "compile": flag("compile", "false"), "compile_mode": mode,
            "compile_budget_s": number("compile_budget_s", 60, 1, 3600),
            "compile_cache_dir": str(params.get("compile_cache_dir", "")).strip() or None,
            "image_size": int(number("image_size", 224, 16, 4096)), "input_type": itype, "sync": sync}
    if opts["compile_cache_dir"] and not os.path.isabs(opts["compile_cache_dir"]):
        raise ValueError(f"parameter compile_cache_dir: {opts['compile_cache_dir']!r} is not an absolute path")
    if opts["compile"] and mode.startswith("max-autotune") and opts["compile_budget_s"] < AUTOTUNE_MIN_BUDGET_S:
        raise ValueError(f"parameter compile_mode: {mode} took about 4 minutes for ResNet-50 on an H200; give "
                         f"compile_budget_s of {AUTOTUNE_MIN_BUDGET_S} or more (and a ready timeout to match), "
                         f"or compile_mode default")
    opts["weights"] = weight_options(params)
    if opts["weights"] and opts["fold_bn"] and opts["weights"]["format"] != "state_dict":
        raise ValueError("parameter fold_bn: only for state_dict weights (an archive is run as it was saved)")
    if opts["compile"] and not opts["cuda_graphs"]:
        raise ValueError("parameter compile: needs cuda_graphs true (the compiled model is replayed as CUDA graphs)")
    return opts


def weight_options(params: dict) -> dict | None:
    """The weights the profile names (weights_file in the version directory, weights_format,
    weights_sha256), or None for random weights."""
    keys = ("weights_file", "weights_format", "weights_sha256")
    v = {k: str(params.get(k, "")).strip() for k in keys}
    if not any(v.values()):
        return None
    missing = [k for k in keys if not v[k]]
    if missing:
        raise ValueError(f"parameter {missing[0]}: needed with the other weights_* parameters")
    if v["weights_format"] not in WEIGHT_FORMATS:
        raise ValueError(f"parameter weights_format: {v['weights_format']!r} is not one of {', '.join(WEIGHT_FORMATS)}")
    if not re.fullmatch(r"[0-9a-f]{64}", v["weights_sha256"]):
        raise ValueError("parameter weights_sha256: not 64 lowercase hex digits")
    if os.path.basename(v["weights_file"]) != v["weights_file"] or v["weights_file"] in (".", ".."):
        raise ValueError(f"parameter weights_file: {v['weights_file']!r} is not a file name")
    return {"file": v["weights_file"], "format": v["weights_format"], "sha256": v["weights_sha256"]}


def private_dir(path: str) -> str:
    """Create (0700) or accept a directory for inductor's cache, which holds code the engine loads:
    refused when it is a link, not a directory, not this user's, or writable by others."""
    import stat
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"compile cache {path}: not a directory (or a link)")
    if st.st_uid != os.geteuid():
        raise ValueError(f"compile cache {path}: owned by uid {st.st_uid}, not this user ({os.geteuid()})")
    if st.st_mode & 0o022:
        raise ValueError(f"compile cache {path}: writable by group or others (mode {st.st_mode & 0o777:o})")
    return path


_SHARED: dict = {}


def _make_forward(torch, model, device, in_dtype, dtype, channels_last: bool):
    """The engine's forward: UINT8 pixels -> (x/255 - mean)/std per channel on the GPU, then the model."""
    scale = shift = None
    if in_dtype == torch.uint8:
        mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1)
        scale, shift = (1 / (255 * std)).to(dtype), (-mean / std).to(dtype)

    def forward(x):
        if scale is not None:
            x = torch.addcmul(shift, x.to(dtype), scale)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return model(x)
    return forward


def file_sha256(path: str) -> str:
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def new_stream(torch, device):
    """A CUDA stream no one else in the process has. torch.cuda.Stream() hands out streams from a
    pool of 32 per priority, round robin: with a dozen instances in one server process a new
    instance's capture stream can be a running instance's stream, and that instance's replay then
    fails ("Cannot prepare for replay during capturing stage") or is captured into the new graph.
    Made with cudaStreamCreateWithFlags (non-blocking) from the CUDA runtime torch has loaded, else
    the driver's cuStreamCreate; a pool stream only where neither can be found (said in the log)."""
    import ctypes
    torch.cuda.synchronize(device)   # the runtime's context is current in this thread
    handle = ctypes.c_void_p()
    libs = []
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "/libcudart.so" in ln})
    except OSError:
        pass
    for lib, fn in [(p, "cudaStreamCreateWithFlags") for p in libs] + [("libcuda.so.1", "cuStreamCreate")]:
        try:
            create = getattr(ctypes.CDLL(lib), fn)
        except (OSError, AttributeError):
            continue
        if create(ctypes.byref(handle), 1) == 0 and handle.value:   # 1: non-blocking
            return torch.cuda.ExternalStream(handle.value, device=device)
    return None


def build_model(torch, torchvision, name: str, num_classes: int, weights: dict | None):
    """The model in eval mode on the CPU: a torchvision architecture with random weights, or with the
    weights the profile names (build.weights: a state_dict for that architecture, a TorchScript
    archive or a torch.export archive), checked against their sha256 first. ValueError naming
    build.weights for a file that is missing, altered, of another architecture or does not load."""
    if weights is None or weights["format"] == "state_dict":
        fn = getattr(torchvision.models, name, None)
        if fn is None:
            raise ValueError(f"torchvision has no model {name!r}")
        model = fn(weights=None, num_classes=num_classes)
    if weights is None:
        return model.eval()
    path, fmt = weights["path"], weights["format"]
    where = f"build.weights: {os.path.basename(path)} ({fmt})"
    try:
        sha = file_sha256(path)
    except OSError as e:
        raise ValueError(f"{where}: cannot read: {e.strerror}") from None
    if sha != weights["sha256"]:
        raise ValueError(f"{where}: sha256 {sha} is not the {weights['sha256']} the profile pins")
    try:
        if fmt == "state_dict":
            sd = torch.load(path, map_location="cpu", weights_only=True)   # no pickled code runs
            if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
                sd = sd["state_dict"]
            if not isinstance(sd, dict):
                raise ValueError(f"holds a {type(sd).__name__}, not a state_dict")
        elif fmt == "torchscript":
            model = torch.jit.load(path, map_location="cpu")
        else:
            model = torch.export.load(path).module()
    except Exception as e:  # noqa: BLE001 - any failure to read the archive is the file's fault
        raise ValueError(f"{where}: does not load: {_first_line(e)}") from None
    if fmt == "state_dict":
        try:
            model.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            raise ValueError(f"{where}: not the weights of {name} with {num_classes} classes: "
                             f"{_first_line(e)}") from None
        return model.eval()
    try:
        return model.eval()
    except (NotImplementedError, RuntimeError):   # an exported module refuses eval(): it is traced as exported
        return model


class TorchEngine:
    """One model on one GPU: pinned host buffers allocated once, a CUDA stream of its own,
    and (cuda_graphs) one captured graph per batch size sharing one memory pool."""

    def __init__(self, name: str, batches, device: str = "cuda:0", fp16: bool = True,
                 channels_last: bool = True, cuda_graphs: bool = True, image_size: int = 224,
                 num_classes: int = 1000, fold_bn: bool = False, input_type: str = "FP16",
                 compile: bool = False, compile_mode: str = "default", compile_cache_dir: str | None = None,
                 compile_budget_s: float = 60, sync: str = "blocking", weights: dict | None = None, log=None):
        if compile and max(batches) > COMPILE_MAX_BATCH:
            raise ValueError(f"compile: batches up to {COMPILE_MAX_BATCH} (asked for {max(batches)})")
        if compile:
            if compile_cache_dir:   # before inductor is imported: it reads these once
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = private_dir(compile_cache_dir)
            os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
            os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
        import torch
        import torchvision
        torch.backends.cudnn.benchmark = True
        self.torch = torch
        self.device = torch.device(device)
        torch.cuda.set_device(self.device)
        self.dtype = torch.float16 if fp16 else torch.float32
        self.np_dtype = np.float16 if fp16 else np.float32
        self.in_np_dtype = INPUT_TYPES[input_type]
        self.in_dtype = {"FP16": torch.float16, "FP32": torch.float32, "UINT8": torch.uint8}[input_type]
        self.batches = sorted({int(b) for b in batches})
        self.max_batch = self.batches[-1]
        self.channels_last = channels_last
        self.cuda_graphs = cuda_graphs
        # one model (and one compiled forward) per process for these settings: instances of a model
        # in one server process (the hkbatch backend) share it, and a compile guarded on one engine
        # would recompile for each (past dynamo's cache limit, silently eager)
        key = (name, fp16, channels_last, fold_bn, compile, compile_mode, input_type, image_size, num_classes,
               str(self.device), (weights or {}).get("sha256"))
        shared = _SHARED.get(key)
        # everything this engine puts on the GPU goes through a stream of its own: the legacy default
        # stream and a device-wide synchronize would wait on (and stall) the instances already serving
        streams = [new_stream(torch, self.device) for _ in range(2)]
        self.private_streams = all(st is not None for st in streams)
        if not self.private_streams and log:
            log("no CUDA runtime found to make private streams: using torch's stream pool (a reload under load "
                "may disturb running instances)")
        init, self.stream = [st or torch.cuda.Stream(self.device) for st in streams]
        with torch.cuda.stream(init):
            if shared is None:
                model = build_model(torch, torchvision, name, num_classes, weights)
                if fold_bn:   # in fp32, before the cast: conv weights absorb the batch norm's scale and shift
                    from torch.fx.experimental.optimization import fuse
                    model = fuse(model)
                model = model.to(self.device, self.dtype)
                if channels_last:
                    model = model.to(memory_format=torch.channels_last)
                fwd = _make_forward(torch, model, self.device, self.in_dtype, self.dtype, channels_last)
                if compile:
                    fwd = torch.compile(fwd, mode=compile_mode)
            else:
                model, fwd = shared
            self.model, self.fwd = model, fwd
            shape = (3, image_size, image_size)
            # blocking: the thread sleeps until the batch is back (spin: it polls, a core each)
            self.done = torch.cuda.Event(blocking=sync == "blocking")
            self.host_in = torch.empty((self.max_batch, *shape), dtype=self.in_dtype).pin_memory()
            self.host_in_np = self.host_in.numpy()
            self.dev_in = torch.zeros((self.max_batch, *shape), dtype=self.in_dtype, device=self.device)
            self.graphs, self.outs = {}, {}
            self.compile_s = None
            t0 = time.monotonic()
            with torch.inference_mode():
                if compile:
                    x = self.dev_in[:self.max_batch]
                    torch._dynamo.mark_dynamic(x, 0, min=2, max=COMPILE_MAX_BATCH)
                    self.fwd(x)
                    init.synchronize()
                    self.compile_s = time.monotonic() - t0
                    if log:
                        log(f"torch.compile ({compile_mode}) in {self.compile_s:.1f} s"
                            + (" (shared with this process's other instances)" if shared else "")
                            + (f": over the budget of {compile_budget_s:g} s" if self.compile_s > compile_budget_s
                               else ""))
                out = self.fwd(self.dev_in[:1])
                self.host_out = torch.empty((self.max_batch, *out.shape[1:]), dtype=out.dtype).pin_memory()
                self.host_out_np = self.host_out.numpy()
                if cuda_graphs:
                    self._capture(init)
        init.synchronize()
        self.stream.wait_stream(init)
        self.capture_s = time.monotonic() - t0
        _SHARED.setdefault(key, (model, fwd))   # once it has run: a failed compile is not kept

    def _capture(self, side):
        """One graph per batch size, captured so that the instances already serving in this process
        never notice: warm-up and capture on a stream of this engine's own, the capture in
        thread-local mode (another thread's synchronize or allocation neither fails nor breaks it),
        graphs in a private pool, and no device-wide synchronize or cache release (torch.cuda.graph
        does both before each capture: they stall every running instance)."""
        torch = self.torch
        pool = torch.cuda.graph_pool_handle()
        with torch.cuda.stream(side):
            for b in reversed(self.batches):   # largest first: the smaller graphs reuse its pool
                x = self.dev_in[:b]
                for _ in range(3):             # cudnn picks its algorithms outside the capture
                    self.fwd(x)
                side.synchronize()
                g = torch.cuda.CUDAGraph()
                g.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    self.outs[b] = self.fwd(x)
                finally:
                    g.capture_end()
                self.graphs[b] = g
        side.synchronize()

    def bucket(self, n: int) -> int:
        for b in self.batches:
            if b >= n:
                return b
        raise ValueError(f"batch {n} is over the largest size {self.max_batch}")

    def run_device(self, n: int):
        """Run the first n rows of the device input buffer; returns the device output (n rows)."""
        if not self.cuda_graphs:
            return self.fwd(self.dev_in[:n])
        b = self.bucket(n)
        self.graphs[b].replay()
        return self.outs[b][:n]

    def run(self, batch: np.ndarray) -> np.ndarray:
        """Host in, host out (a view of the pinned output buffer: copy it before the next run)."""
        n = batch.shape[0]
        self.host_in_np[:n] = batch
        return self.run_pinned(n)

    def run_pinned(self, n: int) -> np.ndarray:
        torch = self.torch
        with torch.cuda.stream(self.stream), torch.inference_mode():
            self.dev_in[:n].copy_(self.host_in[:n], non_blocking=True)
            out = self.run_device(n)
            self.host_out[:n].copy_(out, non_blocking=True)
            self.done.record(self.stream)
        self.done.synchronize()
        return self.host_out_np[:n]


class Stats:
    """Where execute() spends its time, per instance (HKGPU_ENGINE_STATS=DIR: one JSON file per
    process there, rewritten every HKGPU_ENGINE_STATS_EVERY seconds, default 3). Off unless set."""

    PHASES = ("inputs", "copy_in", "gpu", "responses")

    def __init__(self, name: str):
        d = os.environ.get("HKGPU_ENGINE_STATS", "")
        self.path = os.path.join(d, f"{name}-{os.getpid()}.json") if d and os.path.isdir(d) else None
        self.sums = dict.fromkeys(self.PHASES, 0.0)
        self.execs = self.requests = 0
        self.last = time.monotonic()
        try:
            self.every = float(os.environ.get("HKGPU_ENGINE_STATS_EVERY", "3"))
        except ValueError:
            self.every = 3.0

    def add(self, requests: int, marks: list[float]) -> None:
        self.execs += 1
        self.requests += requests
        for k, a, b in zip(self.PHASES, marks, marks[1:]):
            self.sums[k] += b - a
        if self.path and marks[-1] - self.last > self.every:
            self.flush()

    def flush(self) -> None:
        if not self.path or not self.execs:
            return
        self.last = time.monotonic()
        doc = {"execs": self.execs, "requests": self.requests, "avg_batch": round(self.requests / self.execs, 2),
               "us_per_exec": {k: round(v / self.execs * 1e6, 1) for k, v in self.sums.items()},
               "sums_s": self.sums}
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)


def copy_threads(params: dict) -> int:
    """The copy_threads parameter: threads that gather a batch's requests into the pinned buffer."""
    v = str(params.get("copy_threads", "4")).strip()
    if not v.isdigit() or not 1 <= int(v) <= 32:
        raise ValueError(f"parameter copy_threads: {v!r} is not a whole number from 1 to 32")
    return int(v)


class Copier:
    """Gathers the requests' rows into one buffer, split over a few threads (numpy drops the GIL for
    the copy): on the H200 machine one thread took about 600 us of each execute() at batch 34."""

    MIN_ROWS = 8   # below this the threads' hand-off costs more than the copy

    def __init__(self, threads: int):
        self.threads = threads
        self.pool = None
        if threads > 1:
            self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hkgpu-copy")

    def gather(self, arrs: list, counts: list[int], out: np.ndarray) -> None:
        total = sum(counts)
        if self.pool is None or len(arrs) < 2 or total < self.MIN_ROWS:
            np.concatenate(arrs, axis=0, out=out[:total])
            return
        jobs, row, per = [], 0, -(-len(arrs) // self.threads)
        for i in range(0, len(arrs), per):   # contiguous runs of requests, one per thread
            part = arrs[i:i + per]
            n = sum(counts[i:i + per])
            jobs.append(self.pool.submit(np.concatenate, part, axis=0, out=out[row:row + n]))
            row += n
        wait(jobs)   # all done before any error is raised: none still writes into the buffer
        for j in jobs:
            j.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)


def engine_from_args(args: dict, log):
    """The engine of one model instance from Triton's initialize() args (either backend):
    (config, engine, its options, the graph batch sizes, the parameters)."""
    cfg = json.loads(args["model_config"])
    p = {k: v.get("string_value", "") for k, v in cfg.get("parameters", {}).items()}
    opts = engine_options(p, cfg["input"][0].get("data_type", "TYPE_FP16"))
    if opts["compile"] and not opts["compile_cache_dir"]:
        opts["compile_cache_dir"] = os.path.join(args["model_repository"], "inductor-cache")
    max_batch = max(1, int(cfg.get("max_batch_size", 1)))
    preferred = cfg.get("dynamic_batching", {}).get("preferred_batch_size", [])
    sizes = [int(s) for s in p.get("graph_batches", "").split(",") if s.strip()]
    sizes = [s for s in sizes if s <= max_batch] or graph_batches(max_batch, preferred)
    if max_batch not in sizes:
        sizes.append(max_batch)
    copy_threads(p)   # checked before the minutes of compile and capture
    if opts["weights"]:   # in the version directory, beside model.py
        opts["weights"]["path"] = os.path.join(args["model_repository"], str(args.get("model_version", "1")),
                                               opts["weights"]["file"])
    gpu = int(args.get("model_instance_device_id") or 0)
    if args.get("model_instance_kind") == "CPU":
        gpu = 0   # a CPU instance still drives the first visible GPU
    engine = TorchEngine(p.get("torchvision") or "resnet50", sizes, device=f"cuda:{gpu}", log=log, **opts)
    on = [k for k in ("fp16", "channels_last", "cuda_graphs", "fold_bn", "compile") if opts[k]]
    if opts["weights"]:
        on.append(f"weights {opts['weights']['file']} sha256 {opts['weights']['sha256'][:12]}")
    log(f"torch engine on cuda:{gpu} ({', '.join(on)}, input {opts['input_type']}), "
        f"graphs for batches {sizes} ready in {engine.capture_s:.1f} s, pid {os.getpid()}")
    return cfg, engine, p


class TritonBatchModel:
    """The hkbatch backend (batch_backend.cc) gathers a batch's rows into the engine's pinned input
    in C++, calls run(n) once, and copies the rows of the pinned output into the responses."""

    def __init__(self, args):
        name = args.get("model_instance_name")
        cfg, self.engine, p = engine_from_args(args, lambda m: print(f"{name}: {m}", flush=True))
        eng = self.engine
        self.input_name = cfg["input"][0]["name"]
        self.output_name = cfg["output"][0]["name"]
        self.output_dtype = {np.float16: "FP16", np.float32: "FP32"}[eng.host_out_np.dtype.type]
        self.output_dims = ",".join(str(d) for d in eng.host_out_np.shape[1:])
        self.max_batch = eng.max_batch
        self.in_addr, self.out_addr = eng.host_in.data_ptr(), eng.host_out.data_ptr()
        self.in_row_bytes = eng.host_in_np[0].nbytes
        self.out_row_bytes = eng.host_out_np[0].nbytes
        self.copy_threads = copy_threads(p)   # the C++ side's threads for the gather (1 MB batches and up)

    def run(self, n: int) -> None:   # its phases are in Triton's own statistics (the C++ side reports them)
        self.engine.run_pinned(n)

    def finalize(self):
        self.engine = None


class TritonPythonModel:
    """Triton's Python backend: the batcher's requests -> one pinned batch -> one graph replay."""

    def initialize(self, args):
        name = args.get("model_instance_name")
        cfg, self.engine, p = engine_from_args(args, lambda m: pb_utils.Logger.log_info(f"{name}: {m}"))
        self.in_name = cfg["input"][0]["name"]
        self.out_name = cfg["output"][0]["name"]
        self.stats = Stats(str(name).replace("/", "_"))
        self.copier = Copier(copy_threads(p))

    def execute(self, requests):
        eng = self.engine
        t0 = time.perf_counter()
        arrs = [pb_utils.get_input_tensor_by_name(r, self.in_name).as_numpy() for r in requests]
        counts = [a.shape[0] for a in arrs]
        total = sum(counts)
        t1 = time.perf_counter()
        if total <= eng.max_batch:   # the batcher's case: one copy into the pinned buffer
            self.copier.gather(arrs, counts, eng.host_in_np)
            t2 = time.perf_counter()
            out = eng.run_pinned(total)   # a view of the pinned output: the responses copy it
        else:                        # more rows than the largest graph: run it in slices
            t2 = t1
            flat = np.concatenate(arrs, axis=0)
            out = np.empty((total, *eng.host_out_np.shape[1:]), dtype=eng.host_out_np.dtype)
            for s in range(0, total, eng.max_batch):
                n = min(eng.max_batch, total - s)
                eng.host_in_np[:n] = flat[s:s + n]
                out[s:s + n] = eng.run_pinned(n)
        t3 = time.perf_counter()
        responses, pos = [], 0
        for c in counts:   # the stub copies each response into shared memory before the next execute()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.out_name, out[pos:pos + c])]))
            pos += c
        self.stats.add(len(requests), [t0, t1, t2, t3, time.perf_counter()])
        return responses

    def finalize(self):
        self.stats.flush()
        self.copier.close()
        self.engine = None
