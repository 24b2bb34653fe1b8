/*
 * zoo_jemalloc.c -- jemalloc 5 (Debian's libjemalloc2) through the memspec C ABI
 * (written with memspec_kit.h).
 *
 * Each device is a private jemalloc arena (mallctl "arenas.create"), used
 * with MALLOCX_ARENA and no thread cache, so every figure of the arena is
 * this device's: the physical probe is the arena's active pages
 * (stats.arenas.<i>.pactive x arenas.page, after an "epoch" refresh).  The
 * arena is destroyed ("arena.<i>.destroy") with the device.  jemalloc's
 * extents come from the OS (mmap) anywhere in the process, so the plugin says
 * MEMSPEC_HOST_POINTERS and the capacity is a budget on the live footprints
 * (MEMSPEC_KIT_BUDGET).
 *
 * Footprint: sallocx(p) -- the usable size of p's size class.  jemalloc keeps
 * no header in band (block = address).
 *
 * Geometry declared, read from the library itself: bound CLASSES with
 * jemalloc's size classes (arenas.bin.<i>.size, then arenas.lextent.<i>.size
 * up to the first one at least the capacity).
 *
 * Loading: Debian's libjemalloc.so.2 is linked with initial-exec TLS
 * (DF_STATIC_TLS); glibc lets a dlopen()ed library take only the spare
 * static TLS it reserved at start (glibc.rtld.optional_static_tls, 512 bytes
 * by default), so the process must start with e.g.
 * GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memspec_kit.h"
#include "zoo_common.h"

#define DEFAULT_CAPACITY (64ull << 20)
#define MALLOCX_LG_ALIGN(la) ((int)(la))
#define MALLOCX_TCACHE_NONE ((int)(1 << 8))          /* MALLOCX_TCACHE(-1) */
#define MALLOCX_ARENA(a) ((((int)(a)) + 1) << 20)

static void *(*p_mallocx)(size_t, int);
static void (*p_dallocx)(void *, int);
static size_t (*p_sallocx)(const void *, int);
static int (*p_mallctl)(const char *, void *, size_t *, void *, size_t);

typedef struct device {
    uint64_t capacity;
    unsigned arena;
    size_t page;
    uint64_t classes[MEMSPEC_MAX_CLASSES];
    uint64_t nclasses;
} device;

static int ctl_read(const char *name, void *out, size_t len) {
    size_t l = len;
    return p_mallctl(name, out, &l, NULL, 0) == 0 && l == len;
}

static void *j_open(uint64_t capacity, char *err, size_t errlen) {
    static const char *const sonames[] = {"libjemalloc.so.2", NULL};
    if (!p_mallctl) {
        void *lib = zoo_open(sonames, err, errlen);
        if (!lib || !ZOO_SYM(lib, mallocx, err, errlen) || !ZOO_SYM(lib, dallocx, err, errlen)
            || !ZOO_SYM(lib, sallocx, err, errlen) || !ZOO_SYM(lib, mallctl, err, errlen))
            return NULL;
    }
    device *d = calloc(1, sizeof *d);
    if (!d) { snprintf(err, errlen, "no host memory"); return NULL; }
    d->capacity = capacity ? capacity : DEFAULT_CAPACITY;
    size_t sz = sizeof d->arena;
    if (p_mallctl("arenas.create", &d->arena, &sz, NULL, 0) != 0) { snprintf(err, errlen, "mallctl arenas.create failed"); free(d); return NULL; }
    if (!ctl_read("arenas.page", &d->page, sizeof d->page)) d->page = 4096;
    unsigned nbins = 0, nlextents = 0;
    char name[64];
    ctl_read("arenas.nbins", &nbins, sizeof nbins);
    ctl_read("arenas.nlextents", &nlextents, sizeof nlextents);
    for (unsigned i = 0; i < nbins && d->nclasses < MEMSPEC_MAX_CLASSES; i++) {
        size_t s = 0;
        snprintf(name, sizeof name, "arenas.bin.%u.size", i);
        if (ctl_read(name, &s, sizeof s)) d->classes[d->nclasses++] = s;
    }
    for (unsigned i = 0; i < nlextents && d->nclasses < MEMSPEC_MAX_CLASSES; i++) {
        size_t s = 0;
        snprintf(name, sizeof name, "arenas.lextent.%u.size", i);
        if (!ctl_read(name, &s, sizeof s)) break;
        d->classes[d->nclasses++] = s;
        if (s >= d->capacity) break;   /* no request above the capacity is served */
    }
    return d;
}

static void j_close(void *dev) {
    device *d = dev;
    char name[64];
    snprintf(name, sizeof name, "arena.%u.destroy", d->arena);
    p_mallctl(name, NULL, NULL, NULL, 0);
    free(d);
}

static uint64_t j_capacity(void *dev) { return ((device *)dev)->capacity; }

static int flags_of(const device *d, uint64_t alignment) {
    int lg = 0;
    while ((1ull << lg) < alignment) lg++;
    return MALLOCX_ARENA(d->arena) | MALLOCX_TCACHE_NONE | MALLOCX_LG_ALIGN(lg);
}

static int32_t j_alloc(void *dev, uint64_t size, uint64_t alignment, memspec_kit_block *out, char *err, size_t errlen) {
    device *d = dev;
    int flags = flags_of(d, alignment);
    void *p = p_mallocx(size, flags);
    if (!p) { snprintf(err, errlen, "mallocx(%llu, align %llu) returned NULL", (unsigned long long)size, (unsigned long long)alignment); return MEMSPEC_ERR_OUT_OF_MEMORY; }
    out->address = (uint64_t)(uintptr_t)p;
    out->footprint = p_sallocx(p, flags);
    out->block = 0;
    out->cookie = (void *)(uintptr_t)flags;
    return MEMSPEC_OK;
}

static void j_free(void *dev, const memspec_kit_block *b) {
    (void)dev;
    p_dallocx((void *)(uintptr_t)b->address, (int)(uintptr_t)b->cookie);
}

static uint64_t j_physical(void *dev) {
    device *d = dev;
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    p_mallctl("epoch", &epoch, &sz, &epoch, sz);
    char name[64];
    size_t pactive = 0;
    snprintf(name, sizeof name, "stats.arenas.%u.pactive", d->arena);
    if (!ctl_read(name, &pactive, sizeof pactive)) return UINT64_MAX;  /* no stats: an impossible figure, seen */
    return (uint64_t)pactive * d->page;
}

static void j_geometry(void *dev, memspec_geometry *g) {
    device *d = dev;
    if (!d->nclasses) return;
    g->bound = MEMSPEC_BOUND_CLASSES;
    g->classes = d->classes;
    g->nclasses = d->nclasses;
}

static const memspec_kit_ops OPS = {
    .name = "zoo-jemalloc",
    .open = j_open, .close = j_close, .capacity = j_capacity, .alloc = j_alloc, .free = j_free,
    .physical_bytes = j_physical, .geometry = j_geometry,
    .flags = MEMSPEC_HOST_POINTERS,
    .budget = MEMSPEC_KIT_BUDGET,
};

MEMSPEC_KIT_PLUGIN(OPS)
