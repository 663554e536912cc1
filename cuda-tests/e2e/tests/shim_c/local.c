/* A library linked with -lcuda, dlopened RTLD_LOCAL by probe.c: its RTLD_DEFAULT lookups
 * search the global scope, then its own dependencies (libcuda among them). */
#define _GNU_SOURCE
#include <dlfcn.h>

void *local_lookup(const char *name) {
    /* Not a tail call: glibc takes the scope from the return address, which must be ours. */
    void *volatile found = dlsym(RTLD_DEFAULT, name);
    return found;
}
