/* A stand-in libnvidia-ml.so.1 for the dry run of hack/gpu-check.sh: one GPU whose compute
   processes are the live processes with a $FAKE_GPU_STATE/<pid>.state that are not checkpointed
   (with <pid>.bytes each), plus cuInit-only ones (<pid>.cuinit) with 0 bytes, as the real NVML
   lists them. $FAKE_NVML_DRIVER sets the driver version (default 580.95.05). */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct { int unused; } device_t;
typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gi, ci; } process_t;
enum { OK = 0, INVALID_ARGUMENT = 2, NOT_FOUND = 6, INSUFFICIENT_SIZE = 7 };
static const char *UUID = "GPU-00000000-baton-dry0-run0-standin00001";
static device_t gpu0;
static const unsigned long long TOTAL = 143771ULL << 20, BASE_USED = 600ULL << 20;

nvmlReturn_t nvmlInit_v2(void) { return OK; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return OK; }
nvmlReturn_t nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(nvmlReturn_t r) { return r == NOT_FOUND ? "Not Found" : "stand-in NVML error"; }
nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int n) {
  const char *v = getenv("FAKE_NVML_DRIVER"); snprintf(out, n, "%s", v ? v : "580.95.05"); return OK;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { *n = 1; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, device_t **d) { if (i) return INVALID_ARGUMENT; *d = &gpu0; return OK; }
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, device_t **d) { if (strcmp(uuid, UUID)) return NOT_FOUND; *d = &gpu0; return OK; }
nvmlReturn_t nvmlDeviceGetUUID(device_t *d, char *out, unsigned int n) { snprintf(out, n, "%s", UUID); return OK; }
nvmlReturn_t nvmlDeviceGetName(device_t *d, char *out, unsigned int n) { snprintf(out, n, "stand-in GPU"); return OK; }

static long long read_num(const char *dir, int pid, const char *kind) {
  char path[600]; long long v = -1; snprintf(path, sizeof path, "%s/%d.%s", dir, pid, kind);
  FILE *f = fopen(path, "r"); if (!f) return -1;
  if (fscanf(f, "%lld", &v) != 1) v = -1;
  fclose(f); return v;
}
static unsigned int listed(process_t *out, unsigned int max) {
  const char *dir = getenv("FAKE_GPU_STATE"); DIR *d = dir ? opendir(dir) : NULL; struct dirent *e; unsigned int n = 0;
  if (!d) return 0;
  while ((e = readdir(d)) && n < max) {
    int pid; char kind[32];
    if (sscanf(e->d_name, "%d.%31s", &pid, kind) != 2 || kill(pid, 0) != 0) continue;
    if (!strcmp(kind, "cuinit")) { if (read_num(dir, pid, "state") >= 0) continue; out[n].usedGpuMemory = 0; }
    else if (!strcmp(kind, "state")) { long long s = read_num(dir, pid, "state"); if (s < 0 || s == 2) continue;
      long long b = read_num(dir, pid, "bytes"); out[n].usedGpuMemory = b > 0 ? (unsigned long long)b : 0; }
    else continue;
    out[n].pid = (unsigned int)pid; out[n].gi = out[n].ci = 0xFFFFFFFF; n++;
  }
  closedir(d); return n;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(device_t *d, memory_t *m) {
  process_t p[64]; unsigned int n = listed(p, 64); m->total = TOTAL; m->used = BASE_USED;
  for (unsigned int i = 0; i < n; i++) m->used += p[i].usedGpuMemory;
  m->free = m->total - m->used; return OK;
}
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(device_t *d, unsigned int *count, process_t *out) {
  process_t p[64]; unsigned int n = listed(p, 64);
  if (!out || *count < n) { *count = n; return n ? INSUFFICIENT_SIZE : OK; }
  memcpy(out, p, n * sizeof *p); *count = n; return OK;
}
