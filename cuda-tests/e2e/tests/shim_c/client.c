/* Reaches the (mini) driver the three ways applications do and prints what it was told.
 *   client linked           -- direct calls (binary linked with -lcuda -lnvidia-ml)
 *   client dlopen           -- dlopen + dlsym (cudarc, ctypes, pynvml)
 *   client procaddr VER PT  -- dlsym("cuGetProcAddress_v2") then cuGetProcAddress (CUDA runtime)
 *   client fork             -- parent, fork child and fork+exec child each report total memory
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

typedef int (*init_fn)(unsigned);
typedef int (*meminfo_fn)(size_t *, size_t *);
typedef int (*totalmem_fn)(size_t *, int);
typedef int (*gpa2_fn)(const char *, void **, int, unsigned long long, int *);
typedef int (*nvinit_fn)(void);
typedef int (*nvhandle_fn)(unsigned, void **);
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef int (*nvmem_fn)(void *, nvmlMemory_t *);

#ifdef LINKED
int cuInit(unsigned);
int cuMemGetInfo_v2(size_t *, size_t *);
int cuDeviceTotalMem_v2(size_t *, int);
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned, void **);
int nvmlDeviceGetMemoryInfo(void *, nvmlMemory_t *);
#endif

/* Which object and exported name a function pointer belongs to (ASLR-independent). */
static void where(const char *label, void *p) {
    Dl_info info;
    if (!p || !dladdr(p, &info) || !info.dli_fname) { printf("%s -> NULL\n", label); return; }
    const char *base = strrchr(info.dli_fname, '/');
    printf("%s -> %s:%s\n", label, base ? base + 1 : info.dli_fname, info.dli_sname ? info.dli_sname : "?");
}

static void report(const char *path, init_fn init, meminfo_fn meminfo, totalmem_fn totalmem) {
    int rc = init(0);
    size_t free = 0, total = 0, devtotal = 0;
    int rc2 = rc ? -1 : meminfo(&free, &total);
    int rc3 = rc ? -1 : totalmem(&devtotal, 0);
    printf("%s init=%d meminfo=%d free=%zu total=%zu devtotal_rc=%d devtotal=%zu\n", path, rc, rc2, free, total, rc3, devtotal);
}

static void report_nvml(const char *path, nvinit_fn init, nvhandle_fn handle, nvmem_fn mem) {
    void *dev = 0;
    nvmlMemory_t m = {0, 0, 0};
    int rc = init();
    int rc2 = rc ? -1 : handle(0, &dev);
    int rc3 = rc || rc2 ? -1 : mem(dev, &m);
    printf("%s nvml init=%d mem=%d total=%llu used=%llu free=%llu\n", path, rc, rc3, m.total, m.used, m.free);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "linked";
#ifdef LINKED
    if (!strcmp(mode, "linked")) {
        report("linked", cuInit, cuMemGetInfo_v2, cuDeviceTotalMem_v2);
        report_nvml("linked", nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetMemoryInfo);
        return 0;
    }
    if (!strcmp(mode, "fork")) {
        report("parent", cuInit, cuMemGetInfo_v2, cuDeviceTotalMem_v2);
        pid_t pid = fork();
        if (pid == 0) { report("child", cuInit, cuMemGetInfo_v2, cuDeviceTotalMem_v2); _exit(0); }
        int status;
        waitpid(pid, &status, 0);
        printf("child exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        pid = fork();
        if (pid == 0) { execl("/proc/self/exe", argv[0], "linked", (char *)NULL); _exit(127); }
        waitpid(pid, &status, 0);
        printf("exec child exit=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 0;
    }
#endif
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { printf("no libcuda: %s\n", dlerror()); return 2; }
    if (!strcmp(mode, "dlopen")) {
        report("dlopen", (init_fn)dlsym(cuda, "cuInit"), (meminfo_fn)dlsym(cuda, "cuMemGetInfo_v2"),
               (totalmem_fn)dlsym(cuda, "cuDeviceTotalMem_v2"));
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!nvml) { printf("no nvml\n"); return 2; }
        report_nvml("dlopen", (nvinit_fn)dlsym(nvml, "nvmlInit_v2"),
                    (nvhandle_fn)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"),
                    (nvmem_fn)dlsym(nvml, "nvmlDeviceGetMemoryInfo"));
        /* Repeat lookups answer the same, non-NULL. */
        void *a = dlsym(cuda, "cuMemGetInfo_v2"), *b = dlsym(cuda, "cuMemGetInfo_v2");
        printf("repeat same=%d nonnull=%d\n", a == b, a != NULL);
        /* A hooked name the driver lacks: NULL and a dlerror, as without the shim. */
        dlerror();
        void *missing = dlsym(cuda, "cuMemAllocAsync");
        printf("missing null=%d dlerror=%d\n", missing == NULL, dlerror() != NULL);
        /* Through the global scope a missing function answers an error, never a crash. */
        int (*async_alloc)(unsigned long long *, size_t, void *) = dlsym(RTLD_DEFAULT, "cuMemAllocAsync");
        unsigned long long p = 0;
        printf("global missing rc=%d\n", async_alloc ? async_alloc(&p, 1, NULL) : -2);
        return 0;
    }
    if (!strcmp(mode, "procaddr")) {
        int ver = argc > 2 ? atoi(argv[2]) : 12080;
        unsigned long long flags = (argc > 3 && !strcmp(argv[3], "--per-thread")) ? 2 : 0;
        gpa2_fn gpa = (gpa2_fn)dlsym(cuda, "cuGetProcAddress_v2");
        void *p = (void *)0x1;
        int status = -7;
        int rc = gpa("", &p, 0, 0, &status);
        printf("probe rc=%d p=%p status=%d\n", rc, p, status);
        /* The runtime asks for cuGetProcAddress itself and continues through that pointer. */
        gpa2_fn self = 0;
        rc = gpa("cuGetProcAddress", (void **)&self, ver, flags, &status);
        printf("self rc=%d is_dlsym_answer=%d\n", rc, (void *)self == (void *)gpa);
        if (rc != 0 || !self) return 0;
        where("cuGetProcAddress", (void *)self);
        void *v1 = 0;
        gpa("cuGetProcAddress", &v1, 11030, 0, &status);
        where("cuGetProcAddress@11030", v1);
        void *fi = 0, *ft = 0, *fa = 0, *fv = 0, *fg = 0;
        init_fn init = 0;
        self("cuInit", (void **)&init, ver, flags, &status);
        self("cuMemGetInfo", &fi, ver, flags, &status);
        self("cuDeviceTotalMem", &ft, ver, flags, &status);
        self("cuMemAlloc", &fa, ver, flags, &status);
        self("cuDriverGetVersion", &fv, ver, flags, &status);
        self("cuGraphLaunch", &fg, ver, flags, &status);
        report("procaddr", init, (meminfo_fn)fi, (totalmem_fn)ft);
        where("cuMemAlloc", fa);
        where("cuDriverGetVersion", fv);
        where("cuGraphLaunch", fg);
        printf("cuDriverGetVersion same_as_dlsym=%d\n", fv == dlsym(cuda, "cuDriverGetVersion"));
        void *missing = (void *)0x1;
        rc = self("cuMemAllocAsync", &missing, ver, flags, &status);
        printf("missing rc=%d p=%p status=%d\n", rc, missing, status);
        return 0;
    }
    if (!strcmp(mode, "procaddr-legacy")) {
        /* Below 3020 the driver answers "cuMemAlloc" with the legacy 32-bit ABI, its exported
         * symbol "cuMemAlloc": the shim maps it to its own wrapper of that name. */
        gpa2_fn gpa = (gpa2_fn)dlsym(cuda, "cuGetProcAddress_v2");
        void *p = 0;
        int status = -7;
        int rc = gpa("cuMemAlloc", &p, 3010, 0, &status);
        printf("legacy rc=%d status=%d\n", rc, status);
        where("cuMemAlloc@3010", p);
        return 0;
    }
    if (!strcmp(mode, "nvml-lists")) {
        /* Every graphics and MPS process list, as gpustat/Ray/nvidia-smi read them: the count
         * query first, then the entries. Prints "NAME n=N pids=..." with 0 for our own pid. */
        void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!nvml) { printf("no nvml\n"); return 2; }
        void *dev = 0;
        int rc = ((nvinit_fn)dlsym(nvml, "nvmlInit_v2"))();
        int rc2 = rc ? -1 : ((nvhandle_fn)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"))(0, &dev);
        printf("lists init=%d handle=%d\n", rc, rc2);
        const char *names[] = {
            "nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2",
            "nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses",
            "nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        };
        for (int i = 0; i < 6; i++) {
            int v1 = strchr(names[i] + 30, '_') == NULL;
            size_t size = v1 ? 16 : 24; /* {u32 pid; u64 used} / + {u32 gi, ci} */
            unsigned char buf[8 * 24];
            int (*list)(void *, unsigned *, void *) = (int (*)(void *, unsigned *, void *))dlsym(nvml, names[i]);
            unsigned count = 0;
            int q = list(dev, &count, NULL);
            unsigned got = 8;
            int r = list(dev, &got, buf);
            printf("%s query=%d need=%u rc=%d n=%u pids=", names[i], q, count, r, got);
            for (unsigned k = 0; k < got && r == 0; k++) {
                unsigned pid;
                memcpy(&pid, buf + k * size, sizeof pid);
                printf("%u,", pid == (unsigned)getpid() ? 0 : pid);
            }
            printf("\n");
        }
        return 0;
    }
    if (!strcmp(mode, "legacy-nested")) {
        /* The mini driver's 32-bit cuMemAlloc calls its exported cuMemAlloc_v2: one 1 GiB
         * allocation must be charged once, not once per wrapper it passes through. */
        init_fn init = (init_fn)dlsym(cuda, "cuInit");
        int (*alloc_v1)(unsigned *, unsigned) = (int (*)(unsigned *, unsigned))dlsym(cuda, "cuMemAlloc");
        meminfo_fn meminfo = (meminfo_fn)dlsym(cuda, "cuMemGetInfo_v2");
        unsigned p = 0;
        size_t free = 0, total = 0;
        int rc = init(0);
        int rc2 = rc ? -1 : alloc_v1(&p, 1u << 30);
        int rc3 = rc2 ? -1 : meminfo(&free, &total);
        printf("nested alloc=%d meminfo=%d free=%zu total=%zu\n", rc2, rc3, free, total);
        return 0;
    }
    if (!strcmp(mode, "procaddr-unmapped")) {
        /* The mini driver answers "cuMemAllocManaged" with a function it does not export: a
         * pointer the shim cannot map to a wrapper. */
        gpa2_fn gpa = (gpa2_fn)dlsym(cuda, "cuGetProcAddress_v2");
        void *p = 0;
        int status = -7;
        int rc = gpa("cuMemAllocManaged", &p, 12080, 0, &status);
        printf("unmapped rc=%d status=%d\n", rc, status);
        printf("unmapped is_dlsym_answer=%d\n", p == dlsym(cuda, "cuMemAllocManaged"));
        where("cuMemAllocManaged", p);
        return 0;
    }
    printf("unknown mode %s\n", mode);
    return 2;
}
