/* A client of the legacy (pre-3.2) driver ABI: dlopen("libcuda.so.1"), then every legacy
 * entry point by its bare exported name, either through dlsym or through cuGetProcAddress_v2
 * at the version that answers the legacy function (3010 below the _v2 ABI, 7000 for the
 * primary-context release/reset that NVIDIA's own loaders ask for, 12000 for the deprecated
 * launches, which never had another ABI). Prints `key=value` lines; at each `checkpoint NAME`
 * line it waits for a line on stdin, so the test can judge the card and the region while the
 * process still holds (or no longer holds) what it made.
 *
 *   legacy [--procaddr] alloc PATH CHUNK_MIB   v1 context, allocate CHUNK until refused
 *          (PATH: alloc | pitch | array | array3d), report, free, destroy the context
 *   legacy [--procaddr] primary END            retain the primary context, 64 MiB in it
 *          (v1 cuMemAlloc), END (release | reset) through the v1 entry point, retain again
 *   legacy [--procaddr] owners                 two v1 contexts, 64 MiB in the first and
 *          128 MiB in the second (current), the first destroyed while the second's memory
 *          lives on, then that freed and the second destroyed; then two allocations with no
 *          context current (64 MiB, and 3 GiB: past a 2 GiB slice)
 *   legacy [--procaddr] launch PATH COUNT SECONDS   PATH: launch | grid | grid-async;
 *          batches of COUNT kernels, each batch synchronised, until SECONDS have passed
 *          (0: one batch). A grid kernel is 163840 x 1000 one-thread blocks: 1 ms on a V100. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUfunction;
typedef void *CUmodule;
typedef void *CUstream;
typedef void *CUarray;
typedef struct { unsigned Width, Height, Format, NumChannels; } DESC_v1;
typedef struct { unsigned Width, Height, Depth, Format, NumChannels, Flags; } DESC3D_v1;
typedef CUresult (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);

static void *cuda;
static gpa2_fn gpa;

/* `name` by dlsym, or by cuGetProcAddress_v2 at `version`. */
static void *get(const char *name, int version) {
    void *p = NULL;
    if (gpa) {
        int status = -1;
        int rc = gpa(name, &p, version, 0, &status);
        if (rc != 0) p = NULL;
    } else {
        p = dlsym(cuda, name);
    }
    if (!p) { printf("missing %s\n", name); exit(3); }
    return p;
}

/* Which object and exported name a function pointer belongs to. */
static void where(const char *label, void *p) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_fname) { printf("where %s -> NULL\n", label); return; }
    const char *base = strrchr(info.dli_fname, '/');
    printf("where %s -> %s:%s\n", label, base ? base + 1 : info.dli_fname, info.dli_sname ? info.dli_sname : "?");
}

static void checkpoint(const char *name) {
    char line[64];
    printf("checkpoint %s\n", name);
    if (!fgets(line, sizeof line, stdin)) exit(4);
}

static CUresult (*cuInit)(unsigned);
static CUresult (*cuCtxCreate)(CUcontext *, unsigned, CUdevice);
static CUresult (*cuCtxDestroy)(CUcontext);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
static CUresult (*cuDevicePrimaryCtxReset)(CUdevice);
static CUresult (*cuMemAlloc)(unsigned *, unsigned);
static CUresult (*cuMemAllocPitch)(unsigned *, unsigned *, unsigned, unsigned, unsigned);
static CUresult (*cuMemFree)(unsigned);
static CUresult (*cuMemGetInfo)(unsigned *, unsigned *);
static CUresult (*cuDeviceTotalMem)(unsigned *, CUdevice);
static CUresult (*cuArrayCreate)(CUarray *, const DESC_v1 *);
static CUresult (*cuArray3DCreate)(CUarray *, const DESC3D_v1 *);
static CUresult (*cuArrayDestroy)(CUarray);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuLaunch)(CUfunction);
static CUresult (*cuLaunchGrid)(CUfunction, int, int);
static CUresult (*cuLaunchGridAsync)(CUfunction, int, int, CUstream);

#define LOAD(name, version) do { *(void **)&name = get(#name, version); where(#name, (void *)name); } while (0)

static void load(void) {
    LOAD(cuInit, 12000);
    LOAD(cuCtxCreate, 3010);
    LOAD(cuCtxDestroy, 3010);
    LOAD(cuCtxSetCurrent, 12000);
    LOAD(cuCtxSynchronize, 12000);
    LOAD(cuDevicePrimaryCtxRetain, 12000);
    LOAD(cuDevicePrimaryCtxRelease, 7000);
    LOAD(cuDevicePrimaryCtxReset, 7000);
    LOAD(cuMemAlloc, 3010);
    LOAD(cuMemAllocPitch, 3010);
    LOAD(cuMemFree, 3010);
    LOAD(cuMemGetInfo, 3010);
    LOAD(cuDeviceTotalMem, 3010);
    LOAD(cuArrayCreate, 3010);
    LOAD(cuArray3DCreate, 3010);
    LOAD(cuArrayDestroy, 12000);
    LOAD(cuModuleLoadData, 12000);
    LOAD(cuModuleGetFunction, 12000);
    LOAD(cuStreamCreate, 12000);
    LOAD(cuLaunch, 12000);
    LOAD(cuLaunchGrid, 12000);
    LOAD(cuLaunchGridAsync, 12000);
}

static void meminfo(const char *label) {
    unsigned free = 0, total = 0, devtotal = 0;
    int rc = cuMemGetInfo(&free, &total);
    int rc2 = cuDeviceTotalMem(&devtotal, 0);
    printf("%s rc=%d free=%u total=%u devtotal_rc=%d devtotal=%u\n", label, rc, free, total, rc2, devtotal);
}

#define MIB (1u << 20)
#define MAX_OBJECTS 4096

static int alloc_until_oom(const char *path, unsigned chunk_mib) {
    unsigned chunk = chunk_mib * MIB;
    unsigned pointers[MAX_OBJECTS];
    CUarray arrays[MAX_OBJECTS];
    int count = 0, error = 0;
    CUcontext ctx = NULL;
    printf("init rc=%d\n", cuInit(0));
    printf("context rc=%d\n", cuCtxCreate(&ctx, 0, 0));
    meminfo("meminfo");
    int arrays_path = !strcmp(path, "array") || !strcmp(path, "array3d");
    while (count < MAX_OBJECTS) {
        int rc;
        if (!strcmp(path, "alloc")) {
            rc = cuMemAlloc(&pointers[count], chunk);
        } else if (!strcmp(path, "pitch")) {
            unsigned pitch = 0;
            rc = cuMemAllocPitch(&pointers[count], &pitch, 65536, chunk / 65536, 4);
            if (rc == 0 && pitch != 65536) { printf("pitch %u\n", pitch); return 5; }
        } else if (!strcmp(path, "array")) {
            DESC_v1 d = { 1024, chunk / (16 * 1024), 0x20, 4 }; /* float4 */
            rc = cuArrayCreate(&arrays[count], &d);
        } else if (!strcmp(path, "array3d")) {
            DESC3D_v1 d = { 1024, 1024, chunk / MIB, 0x01, 1, 0 }; /* uint8 */
            rc = cuArray3DCreate(&arrays[count], &d);
        } else {
            printf("unknown path %s\n", path);
            return 2;
        }
        if (rc != 0) { error = rc; break; }
        count++;
    }
    printf("alloc count=%d error=%d\n", count, error);
    meminfo("meminfo_held");
    checkpoint("held");
    int ok = 0, failed = 0;
    for (int i = 0; i < count; i++) {
        int rc = arrays_path ? cuArrayDestroy(arrays[i]) : cuMemFree(pointers[i]);
        if (rc == 0) ok++; else failed++;
    }
    printf("free ok=%d failed=%d\n", ok, failed);
    meminfo("meminfo_freed");
    checkpoint("freed");
    printf("destroy rc=%d\n", cuCtxDestroy(ctx));
    checkpoint("destroyed");
    return 0;
}

static int primary(const char *end) {
    CUcontext ctx = NULL;
    unsigned p = 0;
    printf("init rc=%d\n", cuInit(0));
    printf("retain rc=%d\n", cuDevicePrimaryCtxRetain(&ctx, 0));
    printf("current rc=%d\n", cuCtxSetCurrent(ctx));
    printf("alloc rc=%d\n", cuMemAlloc(&p, 64 * MIB));
    checkpoint("held");
    int rc = !strcmp(end, "reset") ? cuDevicePrimaryCtxReset(0) : cuDevicePrimaryCtxRelease(0);
    printf("end %s rc=%d\n", end, rc);
    checkpoint("ended");
    printf("retain rc=%d\n", cuDevicePrimaryCtxRetain(&ctx, 0));
    checkpoint("again");
    return 0;
}

static int owners(void) {
    CUcontext first = NULL, second = NULL;
    unsigned a = 0, b = 0;
    printf("init rc=%d\n", cuInit(0));
    printf("first rc=%d\n", cuCtxCreate(&first, 0, 0));
    printf("alloc first rc=%d\n", cuMemAlloc(&a, 64 * MIB));
    printf("second rc=%d\n", cuCtxCreate(&second, 0, 0));
    printf("alloc second rc=%d\n", cuMemAlloc(&b, 128 * MIB));
    checkpoint("held");
    printf("destroy first rc=%d\n", cuCtxDestroy(first));
    checkpoint("ended");
    printf("free second rc=%d\n", cuMemFree(b));
    printf("destroy second rc=%d\n", cuCtxDestroy(second));
    /* No context is current now: the driver's own answer, under the slice's cap or past it. */
    printf("alloc without small rc=%d\n", cuMemAlloc(&a, 64 * MIB));
    printf("alloc without large rc=%d\n", cuMemAlloc(&a, 3u << 30));
    checkpoint("done");
    return 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int launch(const char *path, int count, double seconds) {
    CUcontext ctx = NULL;
    CUmodule module = NULL;
    CUfunction f = NULL;
    CUstream stream = NULL;
    printf("init rc=%d\n", cuInit(0));
    printf("retain rc=%d\n", cuDevicePrimaryCtxRetain(&ctx, 0));
    printf("current rc=%d\n", cuCtxSetCurrent(ctx));
    printf("module rc=%d\n", cuModuleLoadData(&module, "any bytes"));
    printf("function rc=%d\n", cuModuleGetFunction(&f, module, "spin"));
    printf("stream rc=%d\n", cuStreamCreate(&stream, 0));
    long launches = 0, ok = 0;
    double until = now_s() + seconds;
    do {
        for (int i = 0; i < count; i++) {
            int rc;
            if (!strcmp(path, "launch")) rc = cuLaunch(f);
            else if (!strcmp(path, "grid")) rc = cuLaunchGrid(f, 163840, 1000);
            else if (!strcmp(path, "grid-async")) rc = cuLaunchGridAsync(f, 163840, 1000, stream);
            else { printf("unknown path %s\n", path); return 2; }
            launches++;
            if (rc == 0) ok++;
        }
        cuCtxSynchronize();
    } while (now_s() < until);
    printf("launch launches=%ld ok=%ld\n", launches, ok);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    int arg = 1;
    cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("no libcuda: %s\n", dlerror()); return 2; }
    if (arg < argc && !strcmp(argv[arg], "--procaddr")) {
        gpa = (gpa2_fn)dlsym(cuda, "cuGetProcAddress_v2");
        if (!gpa) { printf("no cuGetProcAddress_v2\n"); return 2; }
        arg++;
    }
    load();
    const char *mode = arg < argc ? argv[arg] : "";
    if (!strcmp(mode, "alloc") && arg + 2 < argc) return alloc_until_oom(argv[arg + 1], (unsigned)atoi(argv[arg + 2]));
    if (!strcmp(mode, "primary") && arg + 1 < argc) return primary(argv[arg + 1]);
    if (!strcmp(mode, "owners")) return owners();
    if (!strcmp(mode, "launch") && arg + 3 < argc) return launch(argv[arg + 1], atoi(argv[arg + 2]), atof(argv[arg + 3]));
    printf("usage: legacy [--procaddr] alloc PATH CHUNK_MIB | primary END | owners | launch PATH COUNT SECONDS\n");
    return 2;
}
