/*
 * zoo_tcmalloc.c -- gperftools' tcmalloc (Debian's libtcmalloc-minimal4, or
 * libgoogle-perftools4's libtcmalloc) through the memspec C ABI (written
 * with memspec_kit.h).
 *
 * tcmalloc has no region or arena API: its pointers are host memory anywhere
 * in the process (MEMSPEC_HOST_POINTERS: the loader's EP reaches only live
 * allocations) and the capacity is a budget on the live footprints
 * (MEMSPEC_KIT_BUDGET).  Loaded RTLD_LOCAL, this tcmalloc serves only the
 * shim, so its own count of the bytes the application holds
 * (MallocExtension "generic.current_allocated_bytes") less the count when the
 * device was opened is this device's physical probe.
 *
 * Footprint: tc_malloc_size(p) -- the bytes of p's size class or span; no
 * header in band (block = address).  Nothing declared about the geometry.
 */
#include <stdint.h>
#include <stdlib.h>

#include "memspec_kit.h"
#include "zoo_common.h"

#define DEFAULT_CAPACITY (64ull << 20)

static void *(*p_tc_malloc)(size_t);
static void *(*p_tc_memalign)(size_t, size_t);
static void (*p_tc_free)(void *);
static size_t (*p_tc_malloc_size)(void *);
static int (*p_MallocExtension_GetNumericProperty)(const char *, size_t *);

typedef struct device { uint64_t capacity; size_t baseline; } device;

static size_t allocated(void) {
    size_t v = 0;
    if (!p_MallocExtension_GetNumericProperty("generic.current_allocated_bytes", &v)) return 0;
    return v;
}

static void *t_open(uint64_t capacity, char *err, size_t errlen) {
    static const char *const sonames[] = {"libtcmalloc_minimal.so.4", "libtcmalloc.so.4", NULL};
    if (!p_tc_malloc) {
        void *lib = zoo_open(sonames, err, errlen);
        if (!lib || !ZOO_SYM(lib, tc_memalign, err, errlen) || !ZOO_SYM(lib, tc_free, err, errlen)
            || !ZOO_SYM(lib, tc_malloc_size, err, errlen)
            || !ZOO_SYM(lib, MallocExtension_GetNumericProperty, err, errlen) || !ZOO_SYM(lib, tc_malloc, err, errlen))
            return NULL;
    }
    device *d = calloc(1, sizeof *d);
    if (!d) { snprintf(err, errlen, "no host memory"); return NULL; }
    d->capacity = capacity ? capacity : DEFAULT_CAPACITY;
    d->baseline = allocated();
    return d;
}

static void t_close(void *dev) { free(dev); }
static uint64_t t_capacity(void *dev) { return ((device *)dev)->capacity; }

static int32_t t_alloc(void *dev, uint64_t size, uint64_t alignment, memspec_kit_block *out, char *err, size_t errlen) {
    (void)dev;
    void *p = alignment > 1 ? p_tc_memalign(alignment, size) : p_tc_malloc(size);
    if (!p) { snprintf(err, errlen, "tc_memalign(%llu, %llu) returned NULL", (unsigned long long)alignment, (unsigned long long)size); return MEMSPEC_ERR_OUT_OF_MEMORY; }
    out->address = (uint64_t)(uintptr_t)p;
    out->footprint = p_tc_malloc_size(p);
    out->block = 0;
    return MEMSPEC_OK;
}

static void t_free(void *dev, const memspec_kit_block *b) { (void)dev; p_tc_free((void *)(uintptr_t)b->address); }

static uint64_t t_physical(void *dev) { return (uint64_t)(allocated() - ((device *)dev)->baseline); }

static const memspec_kit_ops OPS = {
    .name = "zoo-tcmalloc",
    .open = t_open, .close = t_close, .capacity = t_capacity, .alloc = t_alloc, .free = t_free,
    .physical_bytes = t_physical,
    .flags = MEMSPEC_HOST_POINTERS,
    .budget = MEMSPEC_KIT_BUDGET,
};

MEMSPEC_KIT_PLUGIN(OPS)
