/*
 * zoo_glibc.c -- glibc's malloc through the memspec C ABI (written with memspec_kit.h).
 *
 * glibc has no region API: its pointers are host memory anywhere in the
 * process, so the plugin says MEMSPEC_HOST_POINTERS (the loader's EP reaches
 * only live allocations) and the device's capacity is a budget on the live
 * footprints (MEMSPEC_KIT_BUDGET).  No physical probe: the process's own
 * allocations (Python's) share the heap, so no figure of glibc's is this
 * device's alone.
 *
 * Footprint: glibc keeps an in-band chunk header.  An in-use chunk's bytes
 * are its size field (8 bytes before the pointer) and its usable bytes
 * (malloc_usable_size: chunk size - 8, running into the next chunk's
 * prev_size field), so block = p - 8 and footprint = malloc_usable_size(p)
 * + 8 = the chunk size.  An mmapped chunk (size field bit 2) owns its whole
 * mapping: it starts prev_size bytes before the chunk (p - 16), so block =
 * p - 16 - prev_size and footprint = chunk size + prev_size.
 *
 * Geometry declared: alignment 16 (the glibc manual: malloc's blocks are
 * aligned to 16 bytes on 64-bit systems).  Nothing else.
 */
#include <stdint.h>
#include <stdlib.h>

#include "memspec_kit.h"
#include "zoo_common.h"

#define DEFAULT_CAPACITY (64ull << 20)

static void *(*p_malloc)(size_t);
static void (*p_free)(void *);
static int (*p_posix_memalign)(void **, size_t, size_t);
static size_t (*p_malloc_usable_size)(void *);

typedef struct device { uint64_t capacity; } device;

static void *g_open(uint64_t capacity, char *err, size_t errlen) {
    static const char *const sonames[] = {"libc.so.6", NULL};
    if (!p_malloc) {
        void *lib = zoo_open(sonames, err, errlen);
        if (!lib || !ZOO_SYM(lib, posix_memalign, err, errlen) || !ZOO_SYM(lib, malloc_usable_size, err, errlen)
            || !ZOO_SYM(lib, free, err, errlen) || !ZOO_SYM(lib, malloc, err, errlen))
            return NULL;
    }
    device *d = calloc(1, sizeof *d);
    if (!d) { snprintf(err, errlen, "no host memory"); return NULL; }
    d->capacity = capacity ? capacity : DEFAULT_CAPACITY;
    return d;
}

static void g_close(void *dev) { free(dev); }
static uint64_t g_capacity(void *dev) { return ((device *)dev)->capacity; }

static int32_t g_alloc(void *dev, uint64_t size, uint64_t alignment, memspec_kit_block *out, char *err, size_t errlen) {
    (void)dev;
    void *p = NULL;
    int rc = p_posix_memalign(&p, alignment < sizeof(void *) ? sizeof(void *) : alignment, size);
    if (rc || !p) { snprintf(err, errlen, "posix_memalign(%llu, %llu) failed (%d)", (unsigned long long)alignment, (unsigned long long)size, rc); return MEMSPEC_ERR_OUT_OF_MEMORY; }
    uint64_t a = (uint64_t)(uintptr_t)p;
    uint64_t size_field = ((const uint64_t *)p)[-1];
    out->address = a;
    out->cookie = p;
    if (size_field & 2) {  /* IS_MMAPPED: the chunk owns its mapping, prev_size bytes in front of the chunk */
        uint64_t prev = ((const uint64_t *)p)[-2];
        out->block = a - 16 - prev;
        out->footprint = (size_field & ~(uint64_t)7) + prev;
    } else {
        out->block = a - 8;
        out->footprint = p_malloc_usable_size(p) + 8;
    }
    return MEMSPEC_OK;
}

static void g_free(void *dev, const memspec_kit_block *b) { (void)dev; p_free(b->cookie); }

static void g_geometry(void *dev, memspec_geometry *g) { (void)dev; g->alignment = 16; }

static const memspec_kit_ops OPS = {
    .name = "zoo-glibc",
    .open = g_open, .close = g_close, .capacity = g_capacity, .alloc = g_alloc, .free = g_free,
    .geometry = g_geometry,
    .flags = MEMSPEC_HOST_POINTERS,
    .budget = MEMSPEC_KIT_BUDGET,
};

MEMSPEC_KIT_PLUGIN(OPS)
