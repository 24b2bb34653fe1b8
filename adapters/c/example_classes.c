/*
 * example_classes.c -- a memspec C plugin written with memspec_kit.h: a
 * size-class allocator with an in-band header (the worked example of the
 * kit's header and of README's "Writing a target").
 *
 * The device is [base, base + capacity) of host memory (MAP_NORESERVE).
 * Classes are the powers of two from 32 bytes to the capacity, header
 * included.  Every allocation has a 16-byte header in front of its address
 * (magic and class), so a block is [address - 16, address - 16 + class).
 * alloc takes a free block of the class whose address meets the alignment,
 * else carves the next one from the region (skipping to the alignment:
 * the skipped bytes are lost, as in a bump allocator); free reads the
 * header and puts the block on its class's list.  Nothing is ever merged or
 * given back, so physical bytes (the bytes carved) stay above the live
 * footprints: the overhead is left undeclared and measured.
 *
 * The kit does the rest: handles, stale/double/foreign refusal, twins, the
 * ABI table.
 *
 * Build:  cc -shared -fPIC -O2 -I adapters/c -o libclasses.so adapters/c/example_classes.c
 * Broken twin (must be caught):  ... -DMEMSPEC_BROKEN_HEADER_NOT_COUNTED
 *         picks the class from the request alone, forgetting the header: a
 *         request near its class size then runs past its block into the next
 *         block's header (the block no longer holds the requested bytes, and
 *         the next allocation's header overwrites the caller's data).
 */
#include <sys/mman.h>

#include "memspec_kit.h"

#define HEADER 16u
#define MIN_CLASS 32u
#define MAGIC 0x6d656d73706563ull /* "memspec" */
#define DEFAULT_CAPACITY (64ull << 20)
#define MAX_CLASSES 64

typedef struct header { uint64_t magic, cls; } header;
typedef struct freeblk { struct freeblk *next; } freeblk;

typedef struct device {
    uint64_t base, capacity, carved;
    freeblk *free[MAX_CLASSES];   /* per class index: free blocks (their first bytes hold the link) */
    uint64_t classes[MAX_CLASSES];
    unsigned nclasses;
} device;

static void *cl_open(uint64_t capacity, char *err, size_t errlen) {
    device *d = calloc(1, sizeof *d);
    if (!d) { snprintf(err, errlen, "no host memory"); return NULL; }
    d->capacity = capacity ? capacity : DEFAULT_CAPACITY;
    void *mem = mmap(NULL, d->capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) { snprintf(err, errlen, "mmap of %llu bytes failed", (unsigned long long)d->capacity); free(d); return NULL; }
    d->base = (uint64_t)(uintptr_t)mem;
    for (uint64_t c = MIN_CLASS; c <= d->capacity && d->nclasses < MAX_CLASSES; c *= 2) d->classes[d->nclasses++] = c;
    return d;
}

static void cl_close(void *dev) {
    device *d = dev;
    munmap((void *)(uintptr_t)d->base, d->capacity);
    free(d);
}

static uint64_t cl_capacity(void *dev) { return ((device *)dev)->capacity; }

static int32_t cl_alloc(void *dev, uint64_t size, uint64_t alignment, memspec_kit_block *out, char *err, size_t errlen) {
    device *d = dev;
    unsigned c = 0;
#ifdef MEMSPEC_BROKEN_HEADER_NOT_COUNTED
    while (c < d->nclasses && d->classes[c] < size) c++;   /* the planted bug: the header is not counted */
#else
    while (c < d->nclasses && d->classes[c] < size + HEADER) c++;
#endif
    if (c == d->nclasses) { snprintf(err, errlen, "no class holds %llu bytes", (unsigned long long)size); return MEMSPEC_ERR_OUT_OF_MEMORY; }
    uint64_t cls = d->classes[c], align = alignment > HEADER ? alignment : HEADER, blk = 0;
    for (freeblk **p = &d->free[c]; *p; p = &(*p)->next) {   /* a free block of the class, aligned */
        uint64_t b = (uint64_t)(uintptr_t)*p;
        if ((b + HEADER) % align == 0) { blk = b; *p = (*p)->next; break; }
    }
    if (!blk) {  /* carve: the first block start >= the carved end whose address is aligned */
        uint64_t start = d->base + d->carved;
        uint64_t addr = (start + HEADER + align - 1) / align * align;
        if (addr - HEADER + cls > d->base + d->capacity) {
            snprintf(err, errlen, "the region is carved up (%llu of %llu bytes)", (unsigned long long)d->carved,
                     (unsigned long long)d->capacity);
            return MEMSPEC_ERR_OUT_OF_MEMORY;
        }
        blk = addr - HEADER;
        d->carved = blk + cls - d->base;
    }
    header *h = (header *)(uintptr_t)blk;
    h->magic = MAGIC;
    h->cls = c;
    out->address = blk + HEADER;
    out->block = blk;
    out->footprint = cls;         /* the whole block, header included, counted from block */
    return MEMSPEC_OK;
}

static void cl_free(void *dev, const memspec_kit_block *b) {
    device *d = dev;
    header *h = (header *)(uintptr_t)(b->address - HEADER);
    if (h->magic != MAGIC || h->cls >= d->nclasses) return;  /* the header was overwritten: the block is lost */
    unsigned c = (unsigned)h->cls;
    freeblk *f = (freeblk *)h;
    f->next = d->free[c];
    d->free[c] = f;
}

static uint64_t cl_physical(void *dev) { return ((device *)dev)->carved; }

static void cl_memory(void *dev, uint64_t *base, uint64_t *size) {
    *base = ((device *)dev)->base;
    *size = ((device *)dev)->capacity;
}

static void cl_geometry(void *dev, memspec_geometry *g) {
    device *d = dev;
    g->unit = HEADER;
    g->alignment = HEADER;
    g->bound = MEMSPEC_BOUND_CLASSES;
    g->header = HEADER;
    g->classes = d->classes;
    g->nclasses = d->nclasses;
    /* overhead left MEMSPEC_OVERHEAD_UNDECLARED: freed blocks stay carved */
}

static const memspec_kit_ops OPS = {
#ifdef MEMSPEC_BROKEN_HEADER_NOT_COUNTED
    .name = "example-classes-broken",
#else
    .name = "example-classes",
#endif
    .open = cl_open,
    .close = cl_close,
    .capacity = cl_capacity,
    .alloc = cl_alloc,
    .free = cl_free,
    .physical_bytes = cl_physical,
    .memory = cl_memory,
    .geometry = cl_geometry,
};

MEMSPEC_KIT_PLUGIN(OPS)
