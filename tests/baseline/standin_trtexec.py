#!/usr/bin/env python3
"""A stand-in for TensorRT's trtexec running a saved engine (`--loadEngine`), the way the engine
benchmark uses it; TensorRT cannot be installed here. It follows NVIDIA's documentation:
- the option list: `trtexec --help`, printed by samples/common/sampleOptions.cpp of NVIDIA/TensorRT
  (Inference, Reporting and System options) and NVIDIA's "Command-Line Programs" reference;
  an option it does not know is refused ("Unknown option: ...", exit 1), as sampleOptions.cpp does;
- the shapes: samples/common/sampleInference.cpp: a dynamic input with no `--shapes` runs at 1 in
  every dynamic dimension ("Dynamic dimensions required for input: NAME, but no shapes were
  provided. Automatically overriding shape to: 1x3x224x224"); a `--shapes` name the engine lacks,
  or a shape outside the engine's optimization profile, fails the run;
- `--exportTimes=FILE`: a JSON list, one object per inference with `latencyMs` (samples/trtexec
  README, "Collecting and printing a timing trace").

The engine is a JSON file this stand-in reads ({"standin": "trtexec", "inputs": [{"name", "dims"
(-1 dynamic), "min", "opt", "max"}], "outputs": [...]}); anything else is refused as TensorRT refuses
a file that is not a serialized engine. The time of one inference is 1 ms plus
STANDIN_TRTEXEC_MS_PER_ITEM (0.25) ms per batch item, so a benchmark that gets the batch wrong shows.
Each call's arguments are appended to STANDIN_TRTEXEC_LOG when that is set.
"""
import json
import os
import sys

VERSION = "100300"
FLAGS = {"--help", "--verbose", "--noDataTransfers", "--useManagedMemory", "--useSpinWait", "--threads",
         "--useCudaGraph", "--timeDeserialize", "--timeRefit", "--separateProfileRun", "--skipInference",
         "--exposeDMA", "--dumpOutput", "--dumpProfile", "--dumpLayerInfo"}
VALUED = {"--loadEngine", "--shapes", "--loadInputs", "--iterations", "--warmUp", "--duration", "--sleepTime",
          "--idleTime", "--infStreams", "--device", "--avgRuns", "--percentile", "--exportTimes", "--exportOutput",
          "--exportProfile", "--exportLayerInfo", "--persistentCacheRatio", "--profilingVerbosity"}
# build options are real trtexec options, but they make an engine from a model: not this stand-in's job
BUILD = {"--onnx", "--saveEngine", "--fp16", "--int8", "--best", "--minShapes", "--optShapes", "--maxShapes",
         "--inputIOFormats", "--outputIOFormats", "--memPoolSize", "--calib"}


def fail(msg):
    print(f"[E] {msg}", file=sys.stderr)
    print(f"&&&& FAILED TensorRT.trtexec [TensorRT v{VERSION}] # trtexec {' '.join(sys.argv[1:])}")
    sys.exit(1)


def dims_text(d):
    return "x".join(map(str, d))


def main():
    print(f"&&&& RUNNING TensorRT.trtexec [TensorRT v{VERSION}] # trtexec {' '.join(sys.argv[1:])}")
    if os.environ.get("STANDIN_TRTEXEC_LOG"):
        with open(os.environ["STANDIN_TRTEXEC_LOG"], "a") as f:
            f.write(" ".join(sys.argv[1:]) + "\n")
    opts = {}
    for a in sys.argv[1:]:
        name, eq, value = a.partition("=")
        if name in BUILD:
            fail(f"{name}: this stand-in runs saved engines only (--loadEngine)")
        if name in FLAGS and not eq:
            opts[name] = True
        elif name in VALUED and eq and value:
            opts[name] = value
        else:
            fail(f"Unknown option: {a}" if name not in FLAGS | VALUED else f"Option {name} needs a value")
    if "--help" in opts:
        print("=== Inference Options ===\n  --shapes=spec ...")
        return 0
    if "--loadEngine" not in opts:
        fail("Model missing or format not recognized")
    try:
        with open(opts["--loadEngine"]) as f:
            engine = json.load(f)
        assert engine.get("standin") == "trtexec"
        inputs = {t["name"]: t for t in engine["inputs"]}
    except (OSError, ValueError, AssertionError, KeyError, TypeError, AttributeError):
        fail("Error[1]: [runtime.cpp::deserializeCudaEngine] engine deserialization failed")
    shapes = {}
    for pair in opts.get("--shapes", "").split(",") if "--shapes" in opts else []:
        name, _, spec = pair.rpartition(":")
        name = name.strip("'")
        if name not in inputs:
            fail(f"Cannot find input tensor with name \"{name}\" in the engine bindings! "
                 "Please make sure the input tensor names are correct.")
        try:
            shapes[name] = [int(x) for x in spec.split("x")]
        except ValueError:
            fail(f"Invalid shape spec: {pair}")
    batch = None
    for name, t in inputs.items():
        dims = t["dims"]
        if name not in shapes:
            if any(d < 0 for d in dims):
                shapes[name] = [d if d >= 0 else 1 for d in dims]
                print(f"[W] Dynamic dimensions required for input: {name}, but no shapes were provided. "
                      f"Automatically overriding shape to: {dims_text(shapes[name])}")
            else:
                shapes[name] = dims
        s = shapes[name]
        ok = len(s) == len(dims) and all(d < 0 or d == x for d, x in zip(dims, s))
        if ok and any(d < 0 for d in dims):
            ok = all(lo <= x <= hi for lo, x, hi in zip(t["min"], s, t["max"]))
        if not ok:
            fail(f"IExecutionContext::setInputShape: Error Code 3: API Usage Error (Parameter check failed, "
                 f"condition: engineDims.d[i] == dims.d[i] or within the optimization profile "
                 f"[{dims_text(t['min'])}, {dims_text(t['max'])}] for input {name}: {dims_text(s)})")
        batch = s[0]
    if "--skipInference" in opts:
        print(f"&&&& PASSED TensorRT.trtexec [TensorRT v{VERSION}] # trtexec {' '.join(sys.argv[1:])}")
        return 0
    per_item = float(os.environ.get("STANDIN_TRTEXEC_MS_PER_ITEM", "0.25"))
    n = int(opts.get("--iterations", "10")) * 2
    lat = 1.0 + per_item * batch
    if "--exportTimes" in opts:
        with open(opts["--exportTimes"], "w") as f:
            json.dump([{"startHostMs": i * lat, "endHostMs": (i + 1) * lat, "latencyMs": lat, "computeMs": lat}
                       for i in range(n)], f)
    print(f"[I] Throughput: {1000 / lat:.2f} qps")
    print(f"&&&& PASSED TensorRT.trtexec [TensorRT v{VERSION}] # trtexec {' '.join(sys.argv[1:])}")
    return 0


sys.exit(main())
