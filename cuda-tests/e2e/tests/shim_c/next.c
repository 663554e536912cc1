/* dlsym must keep its meaning for its real caller: RTLD_NEXT relative to THIS program, a
 * malloc interposer that calls dlsym from inside malloc, non-CUDA and cu-prefixed names. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static int resolving;
static char early[1 << 16];
static size_t early_used;
static unsigned long interposed_calls;

void *malloc(size_t n) {
    if (!real_malloc) {
        if (resolving) { /* dlsym itself allocated: serve from the static buffer */
            void *p = early + early_used;
            early_used += (n + 15) & ~(size_t)15;
            return p;
        }
        resolving = 1;
        real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
        real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
        resolving = 0;
    }
    interposed_calls++;
    return real_malloc(n);
}

void free(void *p) {
    if ((char *)p >= early && (char *)p < early + sizeof early) return;
    if (!real_free) return; /* freed while dlsym resolves: leak rather than recurse */
    real_free(p);
}

static void where(const char *label, void *p) {
    Dl_info info;
    if (!p) { printf("%s = NULL\n", label); return; }
    if (!dladdr(p, &info) || !info.dli_fname) { printf("%s = ?\n", label); return; }
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    printf("%s = %s+%#lx\n", label, base, (unsigned long)((char *)p - (char *)info.dli_fbase));
}

int main(void) {
    char *x = malloc(10);
    strcpy(x, "ok");
    where("next malloc", dlsym(RTLD_NEXT, "malloc"));
    where("next puts", dlsym(RTLD_NEXT, "puts"));
    where("default puts", dlsym(RTLD_DEFAULT, "puts"));
    where("default curl_easy_init", dlsym(RTLD_DEFAULT, "curl_easy_init"));
    where("default cudnnCreate", dlsym(RTLD_DEFAULT, "cudnnCreate"));
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    where("libc cuserid", dlsym(libc, "cuserid"));
    where("libc cuserid again", dlsym(libc, "cuserid"));
    /* From the main program, RTLD_NEXT finds the next definition AFTER it: with the shim
     * preloaded that is the shim's own export; without it, nothing. */
    where("next cuInit", dlsym(RTLD_NEXT, "cuInit"));
    printf("malloc interposer %s calls=%d\n", x, interposed_calls > 0);
    free(x);
    return 0;
}
