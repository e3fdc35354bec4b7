// A stand-in for how tritonserver loads a backend (Triton's backend docs, "Backend lifecycles":
// the shared library is opened and TRITONBACKEND_Initialize called once, before any model; a
// backend reads TRITONBACKEND_ApiVersion there and returns an error to refuse the server). It
// serves the calls that stage makes, with the API version from the MAJOR and MINOR environment
// variables; prints the backend's error, or "ok". Build: c++ -rdynamic -o host backend_host.cc -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>

struct Error { int code; std::string msg; };

extern "C" {
__attribute__((visibility("default"))) void* TRITONSERVER_ErrorNew(int code, const char* msg) {
  return new Error{code, msg};
}
__attribute__((visibility("default"))) const char* TRITONSERVER_ErrorMessage(void* e) {
  return static_cast<Error*>(e)->msg.c_str();
}
__attribute__((visibility("default"))) void TRITONSERVER_ErrorDelete(void* e) { delete static_cast<Error*>(e); }
__attribute__((visibility("default"))) void* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor) {
  *major = static_cast<uint32_t>(atoi(getenv("MAJOR") ? getenv("MAJOR") : "1"));
  *minor = static_cast<uint32_t>(atoi(getenv("MINOR") ? getenv("MINOR") : "0"));
  return nullptr;
}
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
  if (!lib) { printf("dlopen: %s\n", dlerror()); return 2; }
  auto init = reinterpret_cast<void* (*)(void*)>(dlsym(lib, "TRITONBACKEND_Initialize"));
  if (!init) { printf("ok (no TRITONBACKEND_Initialize: no check)\n"); return 0; }
  void* e = init(nullptr);
  if (e) { printf("%s\n", TRITONSERVER_ErrorMessage(e)); TRITONSERVER_ErrorDelete(e); return 1; }
  printf("ok\n");
  return 0;
}
