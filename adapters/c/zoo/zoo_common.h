/*
 * zoo_common.h -- what the zoo's shims share: loading a third-party
 * allocator with dlopen (no -dev package: the few prototypes each shim needs
 * are declared in the shim itself).
 *
 * A shim loads its library the first time a device is opened and keeps it
 * loaded for the life of the process (RTLD_LOCAL: the library's malloc does
 * not replace the process's).  memspec.adapters.zoo checks, before a run,
 * that the same library loads, and says in one line why not.
 */
#ifndef MEMSPEC_ZOO_COMMON_H
#define MEMSPEC_ZOO_COMMON_H

#include <dlfcn.h>
#include <stdio.h>

/* The first of `sonames` that loads, or NULL with the last dlerror in err. */
static void *zoo_open(const char *const *sonames, char *err, size_t errlen) {
    for (const char *const *s = sonames; *s; s++) {
        void *h = dlopen(*s, RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        const char *e = dlerror();
        snprintf(err, errlen, "%s", e ? e : *s);
    }
    return NULL;
}

/* dlsym into *slot; 0 (and err) when the symbol is missing. */
static int zoo_sym(void *lib, const char *name, void **slot, char *err, size_t errlen) {
    *slot = dlsym(lib, name);
    if (!*slot) snprintf(err, errlen, "symbol %s not found", name);
    return *slot != NULL;
}

#define ZOO_SYM(lib, fn, err, errlen) zoo_sym((lib), #fn, (void **)&p_##fn, (err), (errlen))

#endif
