/* A minimal stand-in libcuda.so.1 for the shim's own e2e tests: one 32 GiB device with a fixed
 * UUID, 2 GiB used by "someone else", a cuGetProcAddress that picks ABI versions and _ptsz
 * variants like the real driver, and deliberately NO cuMemAllocAsync (an "older driver"). */
#include <stddef.h>
#include <string.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
#define GIB (1ULL << 30)
#define TOTAL (32 * GIB)
static unsigned long long allocated;

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = 12080; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(CUdevice *d, int i) { if (i != 0) return 101; *d = 0; return 0; }
CUresult cuCtxGetCurrent(void **c) { *c = (void *)0x1234; return 0; }
CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return 0; }
CUresult cuDeviceGetUuid_v2(unsigned char *u, CUdevice d) {
    if (d != 0) return 101;
    for (int i = 0; i < 16; i++) u[i] = 0xa0 + i;
    return 0;
}
CUresult cuDeviceGetUuid(unsigned char *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) {
    if (!f || !t) return 1;
    *t = TOTAL;
    *f = TOTAL - 2 * GIB - allocated;
    return 0;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { if (d != 0) return 101; *b = TOTAL; return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { allocated += n; *p = 0x7f0000000000ULL + allocated; return 0; }
/* Legacy 32-bit ABI symbol: present in real drivers; cuGetProcAddress answers it below 3020.
 * Built on the EXPORTED cuMemAlloc_v2, called through the PLT (-fPIC keeps it interposable):
 * a driver whose functions call its own exports, so a preloaded shim sees the inner call. */
CUresult cuMemAlloc(unsigned *p, unsigned n) {
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc_v2(&d, n);
    if (r == 0) *p = (unsigned)d;
    return r;
}
/* Not exported: what a driver would hand out if its cuGetProcAddress answered a hooked
 * family (cuMemAllocManaged) with an internal entry point instead of its exported symbol. */
static CUresult internal_alloc_managed(CUdeviceptr *p, size_t n, unsigned flags) {
    (void)flags; allocated += n; *p = 0x7f0000000000ULL + allocated; return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return 0; }
CUresult cuGraphLaunch(void *g, void *s) { (void)g; (void)s; return 0; }
CUresult cuGraphLaunch_ptsz(void *g, void *s) { (void)g; (void)s; return 0; }

CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags);
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status);

static void *lookup(const char *sym, int ver, unsigned long long flags) {
    int per_thread = (flags & 2) != 0;
    if (!strcmp(sym, "cuInit")) return (void *)cuInit;
    if (!strcmp(sym, "cuDriverGetVersion")) return (void *)cuDriverGetVersion;
    if (!strcmp(sym, "cuDeviceGet")) return (void *)cuDeviceGet;
    if (!strcmp(sym, "cuCtxGetCurrent")) return (void *)cuCtxGetCurrent;
    if (!strcmp(sym, "cuCtxGetDevice")) return (void *)cuCtxGetDevice;
    if (!strcmp(sym, "cuMemGetInfo")) return ver >= 3020 ? (void *)cuMemGetInfo_v2 : NULL;
    if (!strcmp(sym, "cuDeviceTotalMem")) return ver >= 3020 ? (void *)cuDeviceTotalMem_v2 : NULL;
    if (!strcmp(sym, "cuMemAlloc")) return ver >= 3020 ? (void *)cuMemAlloc_v2 : (void *)cuMemAlloc;
    if (!strcmp(sym, "cuMemFree")) return (void *)cuMemFree_v2;
    if (!strcmp(sym, "cuMemAllocManaged")) return (void *)internal_alloc_managed;
    if (!strcmp(sym, "cuGraphLaunch")) return per_thread ? (void *)cuGraphLaunch_ptsz : (void *)cuGraphLaunch;
    if (!strcmp(sym, "cuGetProcAddress")) return ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    return NULL;
}

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    if (!sym || !pfn) return 1;
    *pfn = NULL;
    if (ver == 0 || sym[0] == 0) { if (status) *status = 1; return 500; }
    void *p = lookup(sym, ver, flags);
    if (status) *status = p ? 0 : 1;
    if (!p) return 500;
    *pfn = p;
    return 0;
}
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, unsigned long long flags) {
    return cuGetProcAddress_v2(sym, pfn, ver, flags, NULL);
}
