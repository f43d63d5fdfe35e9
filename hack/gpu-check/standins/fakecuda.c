/* A stand-in libcuda.so.1 for the dry run of hack/gpu-check.sh: enough for the real cuda-bindings
   wheel to load, and the checkpoint API with its state in files, so that it outlives the agent
   (on a real driver the state lives in the target process). $FAKE_GPU_STATE/<pid>.state holds a
   process's state; a process without that file has no CUDA context (it makes one late, as a
   PyTorch tenant does at its first CUDA call). Modelled on what the real driver answers:
   - no context: GetState answers NOT_INITIALIZED; a <pid>.cuinit file (cuInit only, no context):
     GetState RUNNING, Lock NOT_INITIALIZED;
   - a checkpoint passes through CHECKPOINTING (4), a restore through RESTORING (5), each taking
     <pid>.bytes at $FAKE_CUDA_GBPS (default 20);
   - a restore of a process with a <pid>.poisoned file (an earlier one ran out of memory)
     answers OPERATING_SYSTEM (304), and its unlock ILLEGAL_STATE (401).
   Every call is appended to $FAKE_CUDA_LOG. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long u64;
typedef struct { unsigned int timeoutMs; unsigned int reserved0; u64 reserved1[7]; } LockArgs;
enum { OK = 0, INVALID_VALUE = 1, NOT_INITIALIZED = 3, OPERATING_SYSTEM = 304,
       ILLEGAL_STATE = 401, NOT_READY = 600 };
enum { RUNNING, LOCKED, CHECKPOINTED, FAILED, CHECKPOINTING, RESTORING };

static void file_of(int pid, const char *kind, char *out) {
  const char *dir = getenv("FAKE_GPU_STATE");
  snprintf(out, 512, "%s/%d.%s", dir ? dir : "/tmp", pid, kind);
}
static long long read_num(int pid, const char *kind) {
  char path[512]; long long v = -1; file_of(pid, kind, path);
  FILE *f = fopen(path, "r"); if (!f) return -1;
  if (fscanf(f, "%lld", &v) != 1) v = -1;
  fclose(f); return v;
}
static int exists(int pid, const char *kind) { char p[512]; file_of(pid, kind, p); return access(p, F_OK) == 0; }
static void write_state(int pid, int state) {
  char path[512], tmp[530]; file_of(pid, "state", path); snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w"); if (!f) return; fprintf(f, "%d\n", state); fclose(f); rename(tmp, path);
}
static void note(const char *call, int pid, long long a) {
  const char *log = getenv("FAKE_CUDA_LOG"); if (!log) return;
  FILE *f = fopen(log, "a"); if (f) { fprintf(f, "%s pid=%d %lld\n", call, pid, a); fclose(f); }
}
static void copy_time(int pid) {
  long long bytes = read_num(pid, "bytes"); const char *g = getenv("FAKE_CUDA_GBPS");
  double gbps = g ? atof(g) : 20.0; if (bytes > 0 && gbps > 0) usleep((useconds_t)(bytes / (gbps * 1e3)));
}

CUresult cuInit(unsigned int flags) { note("cuInit", getpid(), flags); return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
static const char *error_name(CUresult e) {
  switch (e) {
  case OK: return "CUDA_SUCCESS"; case INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
  case 2: return "CUDA_ERROR_OUT_OF_MEMORY"; case NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
  case OPERATING_SYSTEM: return "CUDA_ERROR_OPERATING_SYSTEM"; case ILLEGAL_STATE: return "CUDA_ERROR_ILLEGAL_STATE";
  case NOT_READY: return "CUDA_ERROR_NOT_READY"; case 801: return "CUDA_ERROR_NOT_SUPPORTED";
  }
  return NULL;
}
CUresult cuGetErrorName(CUresult e, const char **p) { *p = error_name(e); return *p ? OK : INVALID_VALUE; }
CUresult cuGetErrorString(CUresult e, const char **p) { return cuGetErrorName(e, p); }

CUresult cuCheckpointProcessGetState(int pid, int *state) {
  long long s = read_num(pid, "state");
  note("GetState", pid, s);
  if (s < 0) { if (exists(pid, "cuinit")) { *state = RUNNING; return OK; } return NOT_INITIALIZED; }
  *state = (int)s; return OK;
}
static CUresult step(const char *call, int pid, int need, int passing, int to) {
  long long s = read_num(pid, "state");
  note(call, pid, s);
  if (s < 0) return exists(pid, "cuinit") ? NOT_INITIALIZED : INVALID_VALUE;
  if (s != need) return ILLEGAL_STATE;
  if (passing >= 0) { write_state(pid, passing); copy_time(pid); }
  write_state(pid, to); return OK;
}
CUresult cuCheckpointProcessLock(int pid, LockArgs *a) {
  note("LockTimeoutMs", pid, a ? (long long)a->timeoutMs : -1);
  return step("Lock", pid, RUNNING, -1, LOCKED);
}
CUresult cuCheckpointProcessCheckpoint(int pid, void *a) { return step("Checkpoint", pid, LOCKED, CHECKPOINTING, CHECKPOINTED); }
CUresult cuCheckpointProcessRestore(int pid, void *a) {
  if (exists(pid, "poisoned") && read_num(pid, "state") == CHECKPOINTED) { note("Restore", pid, 304); return OPERATING_SYSTEM; }
  return step("Restore", pid, CHECKPOINTED, RESTORING, LOCKED);
}
CUresult cuCheckpointProcessUnlock(int pid, void *a) { return step("Unlock", pid, LOCKED, -1, RUNNING); }
CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid) { *tid = pid; return read_num(pid, "state") < 0 ? INVALID_VALUE : OK; }

/* The bindings resolve every driver function by name through these. */
CUresult cuGetProcAddress_v2(const char *sym, void **fn, int version, u64 flags, int *status) {
  static void *self;
  if (!self) { Dl_info info; dladdr((void *)cuInit, &info); self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD); }
  *fn = dlsym(self, sym); if (status) *status = *fn ? 0 : 1;
  return *fn ? OK : 500;
}
CUresult cuGetProcAddress(const char *sym, void **fn, int version, u64 flags, int *status) {
  return cuGetProcAddress_v2(sym, fn, version, flags, status);
}
