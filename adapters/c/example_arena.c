/*
 * example_arena.c -- a memspec C plugin: an arena allocator with a free list.
 *
 * The device is [base, base + capacity) of host memory (an anonymous
 * MAP_NORESERVE mapping: pages cost nothing until written), declared through
 * `memory` so the suite can copy data in and out and check it survives.  Free space is a list of ranges sorted by offset; allocate
 * takes the first range that fits (first fit, 256-byte blocks, any power-of-two
 * alignment), deallocate puts the block back and merges it with its
 * neighbours.  Each instance keeps a table of its live allocations by
 * generation, so foreign, double and stale frees are refused whatever the
 * address.  Only the DeviceAllocator is provided (VirtualBacking and
 * SharedMapping pointers are NULL: explicitly absent).
 *
 * Build:  cc -shared -fPIC -O2 -I adapters/c -o libarena.so adapters/c/example_arena.c
 * Broken twin (must be caught by `memspec conform`):
 *         ... -DMEMSPEC_BROKEN_DOUBLE_FREE   deallocate trusts the address of
 *             a handle that is no longer live and frees it again.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memspec_plugin.h"

#define BLOCK 256u
#define DEFAULT_CAPACITY (256ull << 20)

typedef struct range { uint64_t off, len; } range;

typedef struct device {
    uint64_t base, capacity;
    range *free;
    size_t nfree, cap_free;
    int refs;
} device;

typedef struct live { uint64_t gen, address, size, footprint; } live;

typedef struct arena {
    device *dev;
    uint64_t next_gen;  /* last generation issued */
    live *live;
    size_t nlive, cap_live;
    char err[160];
} arena;

static int32_t fail(arena *a, int32_t code, const char *msg) {
    snprintf(a->err, sizeof a->err, "%s", msg);
    return code;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 1;
    size_t n = *cap ? *cap * 2 : 16;
    while (n < need) n *= 2;
    void *q = realloc(*p, n * elem);
    if (!q) return 0;
    *p = q;
    *cap = n;
    return 1;
}

/* Put [off, off+len) back on the free list, merging with its neighbours. */
static int free_range(device *d, uint64_t off, uint64_t len) {
    size_t i = 0;
    while (i < d->nfree && d->free[i].off < off) i++;
    int merge_prev = i > 0 && d->free[i - 1].off + d->free[i - 1].len == off;
    int merge_next = i < d->nfree && off + len == d->free[i].off;
    if (merge_prev && merge_next) {
        d->free[i - 1].len += len + d->free[i].len;
        memmove(&d->free[i], &d->free[i + 1], (d->nfree - i - 1) * sizeof(range));
        d->nfree--;
    } else if (merge_prev) {
        d->free[i - 1].len += len;
    } else if (merge_next) {
        d->free[i].off = off;
        d->free[i].len += len;
    } else {
        if (!grow((void **)&d->free, &d->cap_free, d->nfree + 1, sizeof(range))) return 0;
        memmove(&d->free[i + 1], &d->free[i], (d->nfree - i) * sizeof(range));
        d->free[i].off = off;
        d->free[i].len = len;
        d->nfree++;
    }
    return 1;
}

static void *arena_create(uint64_t capacity, void *share_with) {
    arena *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    if (share_with) {
        a->dev = ((arena *)share_with)->dev;
        a->dev->refs++;
        return a;
    }
    device *d = calloc(1, sizeof *d);
    if (!d) { free(a); return NULL; }
    d->capacity = capacity ? capacity : DEFAULT_CAPACITY;
    d->capacity -= d->capacity % BLOCK;
    void *mem = d->capacity ? mmap(NULL, d->capacity, PROT_READ | PROT_WRITE,
                                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) : NULL;
    if (mem == MAP_FAILED) { free(d); free(a); return NULL; }
    d->base = (uint64_t)(uintptr_t)mem;
    d->refs = 1;
    if (d->capacity && !free_range(d, 0, d->capacity)) { free(d); free(a); return NULL; }
    a->dev = d;
    return a;
}

static void arena_destroy(void *self) {
    arena *a = self;
    if (!a) return;
    if (--a->dev->refs == 0) {
        if (a->dev->capacity) munmap((void *)(uintptr_t)a->dev->base, a->dev->capacity);
        free(a->dev->free);
        free(a->dev);
    } else {
        for (size_t i = 0; i < a->nlive; i++)  /* a twin's live blocks go back to the device */
            free_range(a->dev, a->live[i].address - a->dev->base, a->live[i].footprint);
    }
    free(a->live);
    free(a);
}

static uint64_t arena_capacity(void *self) { return ((arena *)self)->dev->capacity; }

static uint64_t arena_physical_bytes(void *self) {
    device *d = ((arena *)self)->dev;
    uint64_t f = 0;
    for (size_t i = 0; i < d->nfree; i++) f += d->free[i].len;
    return d->capacity - f;
}

static const char *arena_last_error(void *self) { return ((arena *)self)->err; }

static void arena_memory(void *self, uint64_t *base, uint64_t *size) {
    *base = ((arena *)self)->dev->base;
    *size = ((arena *)self)->dev->capacity;
}

static int32_t arena_allocate(void *self, int64_t size, uint64_t alignment, memspec_handle *out) {
    arena *a = self;
    device *d = a->dev;
    if (size <= 0) return fail(a, MEMSPEC_ERR_INVALID_REQUEST, "size must be positive");
    if (alignment == 0 || (alignment & (alignment - 1))) return fail(a, MEMSPEC_ERR_INVALID_REQUEST, "alignment must be a power of two");
    if ((uint64_t)size > d->capacity) return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "larger than the device");
    uint64_t fp = ((uint64_t)size + BLOCK - 1) / BLOCK * BLOCK;
    for (size_t i = 0; i < d->nfree; i++) {
        range *r = &d->free[i];
        uint64_t addr = d->base + r->off;
        uint64_t aligned = (addr + alignment - 1) / alignment * alignment;
        uint64_t pad = aligned - addr;
        if (pad > r->len || r->len - pad < fp) continue;
        if (!grow((void **)&a->live, &a->cap_live, a->nlive + 1, sizeof(live)))
            return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no host memory for the live table");
        uint64_t off = r->off + pad, rest = r->len - pad - fp;
        if (pad) {          /* keep the head, then the tail */
            r->len = pad;
            if (rest && !free_range(d, off + fp, rest)) {
                r->len = pad + fp + rest;
                return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no host memory for the free list");
            }
        } else if (rest) {
            r->off += fp;
            r->len = rest;
        } else {
            memmove(r, r + 1, (d->nfree - i - 1) * sizeof(range));
            d->nfree--;
        }
        live *l = &a->live[a->nlive++];
        l->gen = ++a->next_gen;
        l->address = aligned;
        l->size = (uint64_t)size;
        l->footprint = fp;
        out->owner = (uint64_t)(uintptr_t)a;
        out->generation = l->gen;
        out->address = aligned;
        out->size = (uint64_t)size;
        out->footprint = fp;
        return MEMSPEC_OK;
    }
    return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no free range fits");
}

static int32_t arena_deallocate(void *self, const memspec_handle *h, uint64_t *freed) {
    arena *a = self;
    if (h->owner != (uint64_t)(uintptr_t)a) return fail(a, MEMSPEC_ERR_FOREIGN_ALLOCATION, "made by another instance");
    for (size_t i = 0; i < a->nlive; i++) {
        live *l = &a->live[i];
        if (l->gen != h->generation) continue;
        if (l->address != h->address || l->footprint != h->footprint)
            return fail(a, MEMSPEC_ERR_STALE_HANDLE, "handle fields do not match the live allocation");
        if (!free_range(a->dev, l->address - a->dev->base, l->footprint))
            return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no host memory for the free list");
        *freed = l->footprint;
        a->live[i] = a->live[--a->nlive];
        return MEMSPEC_OK;
    }
#ifdef MEMSPEC_BROKEN_DOUBLE_FREE
    /* the planted bug: a handle that is no longer live is freed again by its address */
    if (h->generation >= 1 && h->generation <= a->next_gen && h->address >= a->dev->base
        && h->address + h->footprint <= a->dev->base + a->dev->capacity) {
        free_range(a->dev, h->address - a->dev->base, h->footprint);
        *freed = h->footprint;
        return MEMSPEC_OK;
    }
#endif
    if (h->generation >= 1 && h->generation <= a->next_gen)
        return fail(a, MEMSPEC_ERR_DOUBLE_FREE, "already freed");
    return fail(a, MEMSPEC_ERR_STALE_HANDLE, "never issued by this instance");
}

static const memspec_plugin PLUGIN = {
    .abi_version = MEMSPEC_PLUGIN_ABI_VERSION,
#ifdef MEMSPEC_BROKEN_DOUBLE_FREE
    .name = "example-arena-broken",
#else
    .name = "example-arena",
#endif
    .create = arena_create,
    .destroy = arena_destroy,
    .capacity = arena_capacity,
    .physical_bytes = arena_physical_bytes,
    .last_error = arena_last_error,
    .memory = arena_memory,
    .allocate = arena_allocate,
    .deallocate = arena_deallocate,
};

const memspec_plugin *memspec_plugin_v1(void) { return &PLUGIN; }
