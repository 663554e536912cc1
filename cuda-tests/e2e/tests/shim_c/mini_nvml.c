/* A minimal stand-in libnvidia-ml.so.1: one device, same UUID as mini_cuda.c. */
#include <string.h>
#include <unistd.h>
typedef int nvmlReturn_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define GIB (1ULL << 30)
static int inited;
nvmlReturn_t nvmlInit_v2(void) { inited = 1; return 0; }
nvmlReturn_t nvmlInitWithFlags(unsigned f) { (void)f; inited = 1; return 0; }
nvmlReturn_t nvmlShutdown(void) { inited = 0; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, void **d) {
    if (!inited) return 1;
    if (i != 0) return 2;
    *d = (void *)0x100;
    return 0;
}
nvmlReturn_t nvmlDeviceGetUUID(void *d, char *buf, unsigned len) {
    (void)d;
    const char *u = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadaeaf";
    if (len < strlen(u) + 1) return 7;
    strcpy(buf, u);
    return 0;
}
nvmlReturn_t nvmlDeviceGetIndex(void *d, unsigned *i) { (void)d; *i = 0; return 0; }
nvmlReturn_t nvmlDeviceGetMemoryInfo(void *d, nvmlMemory_t *m) {
    if (!inited) return 1;
    (void)d;
    m->total = 32 * GIB; m->used = 2 * GIB; m->free = 30 * GIB;
    return 0;
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *d, nvmlMemory_v2_t *m) {
    if (!inited) return 1;
    (void)d;
    m->total = 32 * GIB; m->reserved = 300ULL << 20; m->used = 2 * GIB - (300ULL << 20); m->free = 30 * GIB;
    return 0;
}

/* Process lists the shim must filter: another tenant (pid 4242, 1 GiB) and the caller itself
 * (512 MiB), in every layout of the graphics and MPS lists, with the count protocol. */
typedef struct { unsigned pid; unsigned long long used; } info_v1;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } info_v2;
#define LIST(name, T)                                                                    \
    nvmlReturn_t name(void *d, unsigned *count, T *infos) {                              \
        (void)d;                                                                         \
        if (!inited) return 1;                                                           \
        if (!count) return 2;                                                            \
        if (!infos || *count < 2) { *count = 2; return 7; }                              \
        memset(infos, 0, 2 * sizeof(T));                                                \
        infos[0].pid = 4242; infos[0].used = GIB;                                        \
        infos[1].pid = (unsigned)getpid(); infos[1].used = GIB / 2;                      \
        *count = 2;                                                                      \
        return 0;                                                                        \
    }
LIST(nvmlDeviceGetGraphicsRunningProcesses, info_v1)
LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, info_v2)
LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, info_v2)
LIST(nvmlDeviceGetMPSComputeRunningProcesses, info_v1)
LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, info_v2)
LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, info_v2)
