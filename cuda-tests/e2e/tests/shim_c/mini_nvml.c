/* A minimal stand-in libnvidia-ml.so.1: one device, same UUID as mini_cuda.c. */
#include <string.h>
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
