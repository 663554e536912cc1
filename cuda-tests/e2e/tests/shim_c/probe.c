/* How programs probe for CUDA without linking it, and what each lookup answers:
 *   dlsym(RTLD_DEFAULT, ...), dlsym(dlopen(NULL), ...) (ctypes.CDLL(None)), a weak reference,
 * first with no driver loaded, then with libcuda.so.1 dlopened RTLD_LOCAL, then promoted to
 * the global scope (RTLD_NOLOAD | RTLD_GLOBAL), and from a library dlopened RTLD_LOCAL that
 * itself depends on libcuda (liblocal.so: RTLD_DEFAULT from there sees its own tree). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

extern int cuInit(unsigned) __attribute__((weak));

static void where(const char *label, void *p) {
    Dl_info info;
    if (!p) { printf("%s = NULL\n", label); return; }
    if (!dladdr(p, &info) || !info.dli_fname) { printf("%s = ?\n", label); return; }
    const char *base = strrchr(info.dli_fname, '/');
    printf("%s = %s:%s\n", label, base ? base + 1 : info.dli_fname, info.dli_sname ? info.dli_sname : "?");
}

static void lookups(const char *stage) {
    char label[128];
    void *main_program = dlopen(NULL, RTLD_NOW);
    const char *names[] = {"cuInit", "cuMemAlloc_v2", "cuGetProcAddress_v2", "nvmlInit_v2"};
    for (unsigned i = 0; i < sizeof names / sizeof *names; i++) {
        dlerror();
        snprintf(label, sizeof label, "%s default %s", stage, names[i]);
        void *p = dlsym(RTLD_DEFAULT, names[i]);
        where(label, p);
        if (!p) printf("%s dlerror=%d\n", label, dlerror() != NULL);
        snprintf(label, sizeof label, "%s main %s", stage, names[i]);
        where(label, dlsym(main_program, names[i]));
    }
}

int main(void) {
    lookups("nodriver");
    where("weak cuInit", (void *)cuInit);
    if (cuInit) printf("weak cuInit rc=%d\n", cuInit(0));
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) { printf("no libcuda\n"); return 0; }
    lookups("local");
    void *local = dlopen("liblocal.so", RTLD_NOW | RTLD_LOCAL);
    if (!local) { printf("no liblocal: %s\n", dlerror()); return 1; }
    void *(*local_lookup)(const char *) = (void *(*)(const char *))dlsym(local, "local_lookup");
    where("from local cuInit", local_lookup("cuInit"));
    where("from local cuNotAFunction", local_lookup("cuNotAFunction"));
    dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
    lookups("global");
    return 0;
}
