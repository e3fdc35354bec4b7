// hkgpu-tune's batch backend for Triton ("hkbatch"). The batcher's requests are gathered here, in
// C++, into one host buffer that a Python model owns; one Python call per batch runs it; the output
// rows are copied into the responses. Triton's Python backend does that work per request (about
// 60 us each, measured on an H200); this does it per batch.
//
// The Python model is REPO/NAME/VERSION/model.py, class TritonBatchModel(args), args as the Python
// backend's initialize() gets them. After __init__ it has input_name, output_name, output_dtype
// ("FP16", ...), output_dims ("1000"), max_batch, in_addr, in_row_bytes, out_addr, out_row_bytes
// (the buffers stay put for its life), and run(n): rows 0..n-1 of the input to rows of the output.
// Optional: copy_threads (default 1) split the gather of batches of copy_min_bytes (1 MB) and up.
// Python is embedded in the server process: HKGPU_PYTHON_LIBRARY names libpython,
// HKGPU_PYTHON_HOME, where given, becomes PYTHONHOME, and HKGPU_PYTHON_EXECUTABLE becomes
// sys.executable; hkgpu-tune sets them when it starts Triton.
//
// Only the parts of Triton's C API this file uses are declared (enums as their int values).
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

extern "C" {
struct TRITONSERVER_Error;
struct TRITONSERVER_Message;
struct TRITONBACKEND_Backend;
struct TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_Request;
struct TRITONBACKEND_Response;
struct TRITONBACKEND_Input;
struct TRITONBACKEND_Output;
typedef TRITONSERVER_Error Err;

Err* TRITONSERVER_ErrorNew(int code, const char* msg);
const char* TRITONSERVER_ErrorMessage(Err* error);
void TRITONSERVER_ErrorDelete(Err* error);
Err* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message, const char** base, size_t* size);
Err* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);
Err* TRITONSERVER_LogMessage(int level, const char* filename, const int line, const char* msg);
Err* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model, const char** name);
Err* TRITONBACKEND_ModelVersion(TRITONBACKEND_Model* model, uint64_t* version);
Err* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* model, int* artifact_type, const char** location);
Err* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model, const uint32_t version, TRITONSERVER_Message** config);
Err* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state);
Err* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state);
Err* TRITONBACKEND_ModelInstanceName(TRITONBACKEND_ModelInstance* instance, const char** name);
Err* TRITONBACKEND_ModelInstanceKind(TRITONBACKEND_ModelInstance* instance, int* kind);
Err* TRITONBACKEND_ModelInstanceDeviceId(TRITONBACKEND_ModelInstance* instance, int32_t* device_id);
Err* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Model** model);
Err* TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance* instance, void** state);
Err* TRITONBACKEND_ModelInstanceSetState(TRITONBACKEND_ModelInstance* instance, void* state);
Err* TRITONBACKEND_ModelInstanceReportStatistics(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request, const bool success,
    const uint64_t exec_start_ns, const uint64_t compute_start_ns, const uint64_t compute_end_ns,
    const uint64_t exec_end_ns);
Err* TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance* instance, const uint64_t batch_size, const uint64_t exec_start_ns,
    const uint64_t compute_start_ns, const uint64_t compute_end_ns, const uint64_t exec_end_ns);
Err* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request, const char* name, TRITONBACKEND_Input** input);
Err* TRITONBACKEND_InputProperties(
    TRITONBACKEND_Input* input, const char** name, int* datatype, const int64_t** shape,
    uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count);
Err* TRITONBACKEND_InputBuffer(
    TRITONBACKEND_Input* input, const uint32_t index, const void** buffer, uint64_t* buffer_byte_size,
    int* memory_type, int64_t* memory_type_id);
Err* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response, TRITONBACKEND_Request* request);
Err* TRITONBACKEND_ResponseOutput(
    TRITONBACKEND_Response* response, TRITONBACKEND_Output** output, const char* name, const int datatype,
    const int64_t* shape, const uint32_t dims_count);
Err* TRITONBACKEND_OutputBuffer(
    TRITONBACKEND_Output* output, void** buffer, const uint64_t buffer_byte_size, int* memory_type,
    int64_t* memory_type_id);
Err* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response, const uint32_t send_flags, Err* error);
Err* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request, uint32_t release_flags);
Err* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor);
}

namespace {

enum { ERR_UNKNOWN = 0, ERR_INTERNAL = 1, ERR_INVALID_ARG = 3, ERR_UNSUPPORTED = 5 };
enum { LOG_INFO = 0, LOG_ERROR = 2 };
enum { MEM_CPU = 0, MEM_CPU_PINNED = 1 };
enum { RESPONSE_FINAL = 1, RELEASE_ALL = 1 };
const char* const TYPES[] = {"INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8",
                             "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16"};

Err* error(int code, const std::string& msg) { return TRITONSERVER_ErrorNew(code, ("hkbatch: " + msg).c_str()); }
void log(int level, const std::string& msg) {
  Err* e = TRITONSERVER_LogMessage(level, __FILE__, __LINE__, ("hkbatch: " + msg).c_str());
  if (e) TRITONSERVER_ErrorDelete(e);
}
uint64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---------------------------------------------------------------- Python, loaded with dlopen
// The stable C API's functions, resolved by name: no Python headers are needed to build this.
typedef void PyObject;
struct Py {
  int (*IsInitialized)();
  void (*InitializeEx)(int);
  void* (*EvalSaveThread)();
  int (*GILStateEnsure)();
  void (*GILStateRelease)(int);
  PyObject* (*ImportModule)(const char*);
  PyObject* (*GetAttrString)(PyObject*, const char*);
  PyObject* (*CallObject)(PyObject*, PyObject*);
  PyObject* (*CallFunctionObjArgs)(PyObject*, ...);
  PyObject* (*DictNew)();
  int (*DictSetItemString)(PyObject*, const char*, PyObject*);
  PyObject* (*DictGetItemString)(PyObject*, const char*);
  PyObject* (*UnicodeFromString)(const char*);
  PyObject* (*UnicodeAsUTF8String)(PyObject*);
  char* (*BytesAsString)(PyObject*);
  PyObject* (*LongFromLongLong)(long long);
  long long (*LongAsLongLong)(PyObject*);
  PyObject* (*ObjectStr)(PyObject*);
  PyObject* (*ErrOccurred)();
  void (*ErrFetch)(PyObject**, PyObject**, PyObject**);
  void (*ErrNormalize)(PyObject**, PyObject**, PyObject**);
  void (*ErrClear)();
  int (*HasAttrString)(PyObject*, const char*);
  PyObject* (*UnicodeJoin)(PyObject*, PyObject*);
  void (*DecRef)(PyObject*);
  PyObject* None;
  int (*RunSimpleStringFlags)(const char*, void*);
  PyObject* (*TupleNew)(long);
  int (*TupleSetItem)(PyObject*, long, PyObject*);
};
Py py;
std::once_flag py_once;
std::string py_error_at_load;

template <typename F>
bool sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  if (!*out) py_error_at_load = std::string("libpython has no ") + name;
  return *out != nullptr;
}

void load_python() {
  const char* path = getenv("HKGPU_PYTHON_LIBRARY");
  if (!path || !*path) {
    py_error_at_load = "HKGPU_PYTHON_LIBRARY is not set (hkgpu-tune sets it to libpython's path when it starts Triton)";
    return;
  }
  const char* home = getenv("HKGPU_PYTHON_HOME");
  if (home && *home && !getenv("PYTHONHOME")) setenv("PYTHONHOME", home, 0);
  // RTLD_GLOBAL: the extension modules Python loads (numpy, torch) resolve its symbols here
  void* lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    py_error_at_load = std::string("cannot load ") + path + ": " + dlerror();
    return;
  }
  bool ok = sym(lib, "Py_IsInitialized", &py.IsInitialized) && sym(lib, "Py_InitializeEx", &py.InitializeEx) &&
      sym(lib, "PyEval_SaveThread", &py.EvalSaveThread) && sym(lib, "PyGILState_Ensure", &py.GILStateEnsure) &&
      sym(lib, "PyGILState_Release", &py.GILStateRelease) && sym(lib, "PyImport_ImportModule", &py.ImportModule) &&
      sym(lib, "PyObject_GetAttrString", &py.GetAttrString) && sym(lib, "PyObject_CallObject", &py.CallObject) &&
      sym(lib, "PyObject_CallFunctionObjArgs", &py.CallFunctionObjArgs) && sym(lib, "PyDict_New", &py.DictNew) &&
      sym(lib, "PyDict_SetItemString", &py.DictSetItemString) &&
      sym(lib, "PyDict_GetItemString", &py.DictGetItemString) &&
      sym(lib, "PyUnicode_FromString", &py.UnicodeFromString) &&
      sym(lib, "PyUnicode_AsUTF8String", &py.UnicodeAsUTF8String) && sym(lib, "PyBytes_AsString", &py.BytesAsString) &&
      sym(lib, "PyLong_FromLongLong", &py.LongFromLongLong) && sym(lib, "PyLong_AsLongLong", &py.LongAsLongLong) &&
      sym(lib, "PyObject_Str", &py.ObjectStr) && sym(lib, "PyErr_Occurred", &py.ErrOccurred) &&
      sym(lib, "PyErr_Fetch", &py.ErrFetch) && sym(lib, "PyErr_NormalizeException", &py.ErrNormalize) &&
      sym(lib, "PyErr_Clear", &py.ErrClear) && sym(lib, "PyObject_HasAttrString", &py.HasAttrString) &&
      sym(lib, "PyUnicode_Join", &py.UnicodeJoin) && sym(lib, "Py_DecRef", &py.DecRef) &&
      sym(lib, "PyTuple_New", &py.TupleNew) && sym(lib, "PyTuple_SetItem", &py.TupleSetItem) &&
      sym(lib, "_Py_NoneStruct", &py.None) && sym(lib, "PyRun_SimpleStringFlags", &py.RunSimpleStringFlags);
  if (!ok) return;
  if (!py.IsInitialized()) {
    py.InitializeEx(0);  // 0: Triton keeps its own signal handlers
    // embedded, sys.executable is tritonserver: subprocesses (inductor's compile workers,
    // multiprocessing) must start Python instead
    py.RunSimpleStringFlags(
        "import os, sys\n"
        "e = os.environ.get('HKGPU_PYTHON_EXECUTABLE')\n"
        "if e:\n"
        "    sys.executable = sys._base_executable = e\n"
        "    import multiprocessing; multiprocessing.set_executable(e)\n"
        "del e\n",
        nullptr);
    py.EvalSaveThread();  // the GIL is taken per call, from Triton's threads
  }
}

struct GIL {
  int state;
  GIL() : state(py.GILStateEnsure()) {}
  ~GIL() { py.GILStateRelease(state); }
};

std::string utf8(PyObject* str) {  // a new reference's text, the reference dropped
  PyObject* b = str ? py.UnicodeAsUTF8String(str) : nullptr;
  std::string out = b ? py.BytesAsString(b) : "";
  if (b) py.DecRef(b);
  if (str) py.DecRef(str);
  return out;
}

// The pending Python exception, cleared: its message, and its traceback in the server's log. Not
// PyErr_Print: on SystemExit that ends the process (every model in it), and it keeps the last
// traceback (and the frames' objects: a model's GPU memory) alive in sys.last_traceback.
std::string py_exception(const std::string& where) {
  if (!py.ErrOccurred()) return where + ": failed with no Python exception";
  PyObject *type, *value, *tb;
  py.ErrFetch(&type, &value, &tb);
  py.ErrNormalize(&type, &value, &tb);
  std::string msg = utf8(value ? py.ObjectStr(value) : nullptr);
  if (msg.empty()) msg = "(an exception with no message)";
  PyObject* mod = py.ImportModule("traceback");
  PyObject* fmt = mod ? py.GetAttrString(mod, "format_exception") : nullptr;
  PyObject* lines = fmt ? py.CallFunctionObjArgs(fmt, type ? type : py.None, value ? value : py.None,
                                                 tb ? tb : py.None, nullptr)
                        : nullptr;
  PyObject* sep = py.UnicodeFromString("");
  std::string text = lines ? utf8(py.UnicodeJoin(sep, lines)) : "";
  for (PyObject* o : {sep, lines, fmt, mod, type, value, tb})
    if (o) py.DecRef(o);
  py.ErrClear();  // whatever formatting it raised
  log(LOG_ERROR, where + ": " + (text.empty() ? msg : text));
  return where + ": " + msg;
}

bool get_int(PyObject* obj, const char* name, long long* out, std::string* err) {
  PyObject* v = py.GetAttrString(obj, name);
  if (!v) {
    *err = py_exception(std::string("attribute ") + name);
    return false;
  }
  *out = py.LongAsLongLong(v);
  py.DecRef(v);
  if (*out == -1 && py.ErrOccurred()) {
    *err = py_exception(std::string("attribute ") + name);
    return false;
  }
  return true;
}

bool get_str(PyObject* obj, const char* name, std::string* out, std::string* err) {
  PyObject* v = py.GetAttrString(obj, name);
  PyObject* b = v ? py.UnicodeAsUTF8String(v) : nullptr;
  if (b) *out = py.BytesAsString(b);
  else *err = py_exception(std::string("attribute ") + name);
  if (b) py.DecRef(b);
  if (v) py.DecRef(v);
  return b != nullptr;
}

// An optional int attribute: absent leaves *out as it is.
bool get_opt_int(PyObject* obj, const char* name, long long* out, std::string* err) {
  return !py.HasAttrString(obj, name) || get_int(obj, name, out, err);
}

void set_item(PyObject* dict, const char* key, const std::string& value) {
  PyObject* v = py.UnicodeFromString(value.c_str());
  py.DictSetItemString(dict, key, v);
  py.DecRef(v);
}

// ---------------------------------------------------------------- work split over a few threads
struct Copy {
  char* dst;
  const void* src;
  size_t size;
};

// Workers that split one batch's work with the calling thread: the gather (memcpy of 150 KB
// images is memory-bound: one thread took about 600 us for a batch of 34 on the H200 host) and
// the responses (Triton's HTTP front end builds each response in the sending thread: about 100 us).
class Pool {
 public:
  typedef std::function<void(size_t part, size_t parts)> Task;
  explicit Pool(int workers) {
    for (int i = 0; i < workers; i++) threads_.emplace_back([this, i] { loop(i + 1); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }
  size_t parts() const { return threads_.size() + 1; }
  // task(0, parts) on this thread, task(k, parts) on worker k; returns when all are done.
  void run(const Task& task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      pending_ = threads_.size();
      generation_++;
    }
    wake_.notify_all();
    task(0, parts());
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(size_t part) {
    uint64_t seen = 0;
    for (;;) {
      const Task* task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_) return;
        seen = generation_;
        task = task_;
      }
      (*task)(part, parts());
      {
        std::lock_guard<std::mutex> lock(mu_);
        pending_--;
      }
      done_.notify_one();
    }
  }
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const Task* task_ = nullptr;
  size_t pending_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
};

void copy_part(const std::vector<Copy>& jobs, size_t part, size_t parts) {
  for (size_t j = part; j < jobs.size(); j += parts) memcpy(jobs[j].dst, jobs[j].src, jobs[j].size);
}

// ---------------------------------------------------------------- one model, one namespace
// model.py runs once per loaded model: its instances share the module's globals (the torch engine
// keeps one model and compiled forward there), and a reload gets a fresh namespace.
struct Model {
  std::string rel;         // MODEL/VERSION/model.py, for errors
  PyObject* ns = nullptr;  // runpy.run_path's result
};

Err* model_start(TRITONBACKEND_Model* triton, Model* m) {
  std::call_once(py_once, load_python);
  if (!py_error_at_load.empty()) return error(ERR_UNSUPPORTED, py_error_at_load);
  const char *name, *repo;
  uint64_t version;
  int artifact;
  Err* e;
  if ((e = TRITONBACKEND_ModelName(triton, &name)) || (e = TRITONBACKEND_ModelVersion(triton, &version)) ||
      (e = TRITONBACKEND_ModelRepository(triton, &artifact, &repo)))
    return e;
  const std::string file = std::string(repo) + "/" + std::to_string(version) + "/model.py";
  m->rel = std::string(name) + "/" + std::to_string(version) + "/model.py";
  GIL gil;
  PyObject* runpy = py.ImportModule("runpy");
  PyObject* run_path = runpy ? py.GetAttrString(runpy, "run_path") : nullptr;
  PyObject* path = py.UnicodeFromString(file.c_str());
  PyObject* run_name = py.UnicodeFromString((std::string("hkbatch_") + name).c_str());
  m->ns = run_path ? py.CallFunctionObjArgs(run_path, path, py.None, run_name, nullptr) : nullptr;
  py.DecRef(path);
  py.DecRef(run_name);
  if (run_path) py.DecRef(run_path);
  if (runpy) py.DecRef(runpy);
  if (!m->ns) return error(ERR_INVALID_ARG, py_exception("loading " + m->rel));
  return nullptr;
}

void model_stop(Model* m) {
  if (!m->ns) return;
  GIL gil;
  py.DecRef(m->ns);
}

// ---------------------------------------------------------------- one model instance
struct Instance {
  TRITONBACKEND_ModelInstance* triton = nullptr;
  std::string name;
  PyObject* model = nullptr;  // the TritonBatchModel
  PyObject* run = nullptr;    // its bound run()
  std::string input_name, output_name;
  int output_type = 0;
  std::vector<int64_t> output_dims;
  long long max_batch = 0, in_row_bytes = 0, out_row_bytes = 0;
  char* in = nullptr;
  const char* out = nullptr;
  long long copy_threads = 1, copy_min_bytes = 1 << 20;  // optional attributes of the model
  std::unique_ptr<Pool> pool;  // copy_threads - 1 workers
};

Err* start(TRITONBACKEND_ModelInstance* triton, Instance* inst) {
  std::call_once(py_once, load_python);
  if (!py_error_at_load.empty()) return error(ERR_UNSUPPORTED, py_error_at_load);
  TRITONBACKEND_Model* model;
  const char *model_name, *repo, *inst_name;
  uint64_t version;
  int artifact, kind;
  int32_t device;
  TRITONSERVER_Message* cfg;
  const char* json;
  size_t json_size;
  Err* e;
  if ((e = TRITONBACKEND_ModelInstanceModel(triton, &model)) || (e = TRITONBACKEND_ModelName(model, &model_name)) ||
      (e = TRITONBACKEND_ModelVersion(model, &version)) ||
      (e = TRITONBACKEND_ModelRepository(model, &artifact, &repo)) ||
      (e = TRITONBACKEND_ModelInstanceName(triton, &inst_name)) ||
      (e = TRITONBACKEND_ModelInstanceKind(triton, &kind)) ||
      (e = TRITONBACKEND_ModelInstanceDeviceId(triton, &device)) || (e = TRITONBACKEND_ModelConfig(model, 1, &cfg)))
    return e;
  if ((e = TRITONSERVER_MessageSerializeToJson(cfg, &json, &json_size))) {
    TRITONSERVER_MessageDelete(cfg);
    return e;
  }
  std::string config(json, json_size);
  TRITONSERVER_MessageDelete(cfg);
  inst->triton = triton;
  inst->name = inst_name;
  void* vstate;
  if ((e = TRITONBACKEND_ModelState(model, &vstate))) return e;
  Model* m = static_cast<Model*>(vstate);
  if (!m) return error(ERR_INTERNAL, "the model did not initialize");
  const std::string& rel = m->rel;
  static const char* const KINDS[] = {"AUTO", "CPU", "GPU", "MODEL"};

  GIL gil;
  std::string err;
  PyObject* cls = py.DictGetItemString(m->ns, "TritonBatchModel");  // borrowed
  if (!cls) return error(ERR_INVALID_ARG, rel + " has no class TritonBatchModel");
  PyObject* args = py.DictNew();
  set_item(args, "model_config", config);
  set_item(args, "model_repository", repo);
  set_item(args, "model_version", std::to_string(version));
  set_item(args, "model_name", model_name);
  set_item(args, "model_instance_name", inst_name);
  set_item(args, "model_instance_kind", KINDS[kind >= 0 && kind < 4 ? kind : 0]);
  set_item(args, "model_instance_device_id", std::to_string(device));
  PyObject* tuple = py.TupleNew(1);
  py.TupleSetItem(tuple, 0, args);  // steals args
  inst->model = py.CallObject(cls, tuple);
  py.DecRef(tuple);
  if (!inst->model) return error(ERR_INVALID_ARG, py_exception(rel + ": TritonBatchModel()"));
  long long in_addr, out_addr;
  std::string dtype, dims;
  if (!get_str(inst->model, "input_name", &inst->input_name, &err) ||
      !get_str(inst->model, "output_name", &inst->output_name, &err) ||
      !get_str(inst->model, "output_dtype", &dtype, &err) || !get_str(inst->model, "output_dims", &dims, &err) ||
      !get_int(inst->model, "max_batch", &inst->max_batch, &err) ||
      !get_int(inst->model, "in_addr", &in_addr, &err) || !get_int(inst->model, "in_row_bytes", &inst->in_row_bytes, &err) ||
      !get_int(inst->model, "out_addr", &out_addr, &err) ||
      !get_int(inst->model, "out_row_bytes", &inst->out_row_bytes, &err) ||
      !get_opt_int(inst->model, "copy_threads", &inst->copy_threads, &err) ||
      !get_opt_int(inst->model, "copy_min_bytes", &inst->copy_min_bytes, &err))
    return error(ERR_INVALID_ARG, err);
  if (inst->copy_threads < 1 || inst->copy_threads > 32 || inst->copy_min_bytes < 0)
    return error(ERR_INVALID_ARG, "copy_threads must be 1 to 32 and copy_min_bytes 0 or more");
  if (inst->copy_threads > 1) inst->pool.reset(new Pool(int(inst->copy_threads - 1)));
  for (int t = 1; t < 15; t++)
    if (dtype == TYPES[t]) inst->output_type = t;
  if (!inst->output_type) return error(ERR_INVALID_ARG, "output_dtype " + dtype + " is not a Triton data type");
  for (const char* p = dims.c_str(); *p;) {  // "3,224,224"
    char* end;
    long long d = strtoll(p, &end, 10);
    if (end == p || d <= 0) return error(ERR_INVALID_ARG, "output_dims " + dims + " is not a list of sizes");
    inst->output_dims.push_back(d);
    p = *end == ',' ? end + 1 : end;
  }
  if (inst->max_batch < 1 || !in_addr || !out_addr || inst->in_row_bytes < 1 || inst->out_row_bytes < 1)
    return error(ERR_INVALID_ARG, "max_batch, in_addr, in_row_bytes, out_addr and out_row_bytes must be set");
  inst->in = reinterpret_cast<char*>(in_addr);
  inst->out = reinterpret_cast<const char*>(out_addr);
  inst->run = py.GetAttrString(inst->model, "run");
  if (!inst->run) return error(ERR_INVALID_ARG, py_exception("TritonBatchModel.run"));
  log(LOG_INFO, inst->name + ": " + rel + ", batches up to " + std::to_string(inst->max_batch) + ", rows of " +
      std::to_string(inst->in_row_bytes) + " bytes in, " + std::to_string(inst->out_row_bytes) + " out, " +
      std::to_string(inst->copy_threads) + " copy thread(s)");
  return nullptr;
}

void stop(Instance* inst) {
  if (!inst->model) return;
  GIL gil;
  PyObject* fin = py.HasAttrString(inst->model, "finalize") ? py.GetAttrString(inst->model, "finalize") : nullptr;
  if (fin) {
    PyObject* r = py.CallObject(fin, nullptr);
    if (!r) py_exception(inst->name + ": finalize()");
    else py.DecRef(r);
    py.DecRef(fin);
  }
  if (inst->run) py.DecRef(inst->run);
  py.DecRef(inst->model);
}

// The copies of one request's input rows into the batch (at row `at`), added to jobs; the error
// names what is wrong with the request.
Err* gather(Instance* inst, TRITONBACKEND_Request* req, long long at, long long* rows, std::vector<Copy>* jobs) {
  TRITONBACKEND_Input* input;
  const int64_t* shape;
  uint32_t dims, buffers;
  uint64_t bytes;
  int dtype;
  Err* e = TRITONBACKEND_RequestInput(req, inst->input_name.c_str(), &input);
  if (e) return e;
  if ((e = TRITONBACKEND_InputProperties(input, nullptr, &dtype, &shape, &dims, &bytes, &buffers))) return e;
  if (dims < 1 || shape[0] < 1) return error(ERR_INVALID_ARG, "input " + inst->input_name + " has no batch dimension");
  *rows = shape[0];
  if (at + *rows > inst->max_batch)
    return error(ERR_INVALID_ARG, "a batch of " + std::to_string(at + *rows) + " rows is over max_batch " +
                                      std::to_string(inst->max_batch));
  if (bytes != uint64_t(*rows * inst->in_row_bytes))
    return error(ERR_INVALID_ARG, "input " + inst->input_name + ": " + std::to_string(bytes) + " bytes for " +
                                      std::to_string(*rows) + " rows of " + std::to_string(inst->in_row_bytes));
  char* dst = inst->in + at * inst->in_row_bytes;
  for (uint32_t b = 0; b < buffers; b++) {
    const void* src;
    uint64_t size;
    int mem = MEM_CPU;
    int64_t mem_id = 0;
    if ((e = TRITONBACKEND_InputBuffer(input, b, &src, &size, &mem, &mem_id))) return e;
    if (mem != MEM_CPU && mem != MEM_CPU_PINNED)
      return error(ERR_UNSUPPORTED, "input " + inst->input_name + " is in GPU memory; send it in host memory");
    jobs->push_back({dst, src, size_t(size)});
    dst += size;
  }
  return nullptr;
}

Err* respond(Instance* inst, TRITONBACKEND_Response* resp, long long at, long long rows) {
  std::vector<int64_t> shape{rows};
  shape.insert(shape.end(), inst->output_dims.begin(), inst->output_dims.end());
  TRITONBACKEND_Output* output;
  Err* e = TRITONBACKEND_ResponseOutput(resp, &output, inst->output_name.c_str(), inst->output_type, shape.data(),
                                        uint32_t(shape.size()));
  if (e) return e;
  void* buf;
  const uint64_t size = uint64_t(rows * inst->out_row_bytes);
  int mem = MEM_CPU;
  int64_t mem_id = 0;
  if ((e = TRITONBACKEND_OutputBuffer(output, &buf, size, &mem, &mem_id))) return e;
  if (mem != MEM_CPU && mem != MEM_CPU_PINNED) return error(ERR_UNSUPPORTED, "Triton gave GPU memory for the output");
  memcpy(buf, inst->out + at * inst->out_row_bytes, size);
  return nullptr;
}

// A model's or an instance's state: started, then handed to Triton. Whatever fails (the start, or
// Triton taking the state) leaves no state behind; Triton still calls Finalize, which finds none.
template <typename T, typename H>
Err* begin(H* triton, Err* (*start_fn)(H*, T*), void (*stop_fn)(T*), Err* (*set_state)(H*, void*)) {
  T* obj = new T();
  Err* e = start_fn(triton, obj);
  Err* se = set_state(triton, e ? nullptr : obj);
  if (e || se) {
    stop_fn(obj);
    delete obj;
  }
  if (e && se) TRITONSERVER_ErrorDelete(se);
  return e ? e : se;
}

template <typename T, typename H>
Err* end(H* triton, Err* (*get_state)(H*, void**), void (*stop_fn)(T*)) {
  void* state;
  if (Err* e = get_state(triton, &state)) return e;
  if (T* obj = static_cast<T*>(state)) {
    stop_fn(obj);
    delete obj;
  }
  return nullptr;
}

}  // namespace

extern "C" {

// The backend API these declarations follow (tritonbackend.h's TRITONBACKEND_API_VERSION_MAJOR and
// _MINOR of the Triton they were written against): a server with another major, or an older minor,
// may lay out these calls differently, so the backend refuses to load there (Triton's own backends
// make the same check in TRITONBACKEND_Initialize).
static const uint32_t API_MAJOR = 1, API_MINOR = 19;

__attribute__((visibility("default"))) Err* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  uint32_t major = 0, minor = 0;
  Err* e = TRITONBACKEND_ApiVersion(&major, &minor);
  if (e) return e;
  if (major != API_MAJOR || minor < API_MINOR)
    return error(ERR_UNSUPPORTED, "this Triton's backend API is " + std::to_string(major) + "." +
                                      std::to_string(minor) + "; hkbatch was written for " +
                                      std::to_string(API_MAJOR) + "." + std::to_string(API_MINOR) +
                                      " and later " + std::to_string(API_MAJOR) + ".x (use the python backend)");
  return nullptr;
}

__attribute__((visibility("default"))) Err* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* triton) {
  return begin<Model>(triton, model_start, model_stop, TRITONBACKEND_ModelSetState);
}

__attribute__((visibility("default"))) Err* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* triton) {
  return end<Model>(triton, TRITONBACKEND_ModelState, model_stop);
}

__attribute__((visibility("default"))) Err* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* triton) {
  return begin<Instance>(triton, start, stop, TRITONBACKEND_ModelInstanceSetState);
}

__attribute__((visibility("default"))) Err* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* triton) {
  return end<Instance>(triton, TRITONBACKEND_ModelInstanceState, stop);
}

__attribute__((visibility("default"))) Err* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* triton, TRITONBACKEND_Request** requests, const uint32_t count) {
  void* state;
  Err* e = TRITONBACKEND_ModelInstanceState(triton, &state);
  if (e) return e;
  Instance* inst = static_cast<Instance*>(state);
  if (!inst) return error(ERR_INTERNAL, "execute on an instance that did not initialize");
  const uint64_t exec_start = now_ns();
  std::vector<long long> at(count, 0), rows(count, 0);
  std::vector<Err*> errs(count, nullptr);
  long long total = 0;
  std::vector<Copy> jobs;
  jobs.reserve(count);
  for (uint32_t i = 0; i < count; i++) {
    at[i] = total;
    const size_t first = jobs.size();
    errs[i] = gather(inst, requests[i], total, &rows[i], &jobs);
    if (errs[i]) jobs.resize(first);  // none of a refused request's copies
    else total += rows[i];
  }
  if (inst->pool && jobs.size() > 1 && total * inst->in_row_bytes >= inst->copy_min_bytes)
    inst->pool->run([&jobs](size_t part, size_t parts) { copy_part(jobs, part, parts); });
  else
    copy_part(jobs, 0, 1);
  const uint64_t compute_start = now_ns();
  std::string failed;
  if (total > 0) {
    GIL gil;
    PyObject* n = py.LongFromLongLong(total);
    PyObject* r = py.CallFunctionObjArgs(inst->run, n, nullptr);
    py.DecRef(n);
    if (r) py.DecRef(r);
    else failed = py_exception(inst->name + ": run(" + std::to_string(total) + ")");
  }
  const uint64_t compute_end = now_ns();
  // One response per request; requests on different threads (Triton allows that for different
  // requests), each request's response built and sent by one thread.
  std::vector<char> ok(count, 0);
  auto respond_part = [&](size_t part, size_t parts) {
    for (size_t i = part; i < count; i += parts) {
      if (!errs[i] && !failed.empty()) errs[i] = error(ERR_INTERNAL, failed);
      TRITONBACKEND_Response* resp = nullptr;
      Err* re = TRITONBACKEND_ResponseNew(&resp, requests[i]);
      if (re) {  // no response can be sent: the request is released below, the error logged
        log(LOG_ERROR, inst->name + ": " + TRITONSERVER_ErrorMessage(re));
        TRITONSERVER_ErrorDelete(re);
        if (errs[i]) TRITONSERVER_ErrorDelete(errs[i]);
        continue;
      }
      if (!errs[i]) errs[i] = respond(inst, resp, at[i], rows[i]);
      ok[i] = errs[i] == nullptr;
      Err* se = TRITONBACKEND_ResponseSend(resp, RESPONSE_FINAL, errs[i]);
      if (errs[i]) TRITONSERVER_ErrorDelete(errs[i]);  // the sender keeps its error
      if (se) {
        log(LOG_ERROR, inst->name + ": sending a response: " + TRITONSERVER_ErrorMessage(se));
        TRITONSERVER_ErrorDelete(se);
      }
    }
  };
  if (inst->pool && count >= 4) inst->pool->run(respond_part);
  else respond_part(0, 1);
  const uint64_t exec_end = now_ns();
  for (uint32_t i = 0; i < count; i++) {
    Err* se = TRITONBACKEND_ModelInstanceReportStatistics(triton, requests[i], ok[i], exec_start, compute_start,
                                                          compute_end, exec_end);
    if (se) TRITONSERVER_ErrorDelete(se);
    se = TRITONBACKEND_RequestRelease(requests[i], RELEASE_ALL);
    if (se) TRITONSERVER_ErrorDelete(se);
  }
  if (total > 0) {
    Err* se = TRITONBACKEND_ModelInstanceReportBatchStatistics(triton, uint64_t(total), exec_start, compute_start,
                                                               compute_end, exec_end);
    if (se) TRITONSERVER_ErrorDelete(se);
  }
  return nullptr;
}

}  // extern "C"
