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
 * address.  The DeviceAllocator is always provided; SharedMapping is not (its
 * pointers are NULL: explicitly absent).
 *
 * Its geometry (ABI 2), declared strictly because it is exactly what the code
 * does: a footprint is the request rounded up to 256 bytes (BLOCK) whatever
 * the alignment (the alignment padding goes back on the free list), every
 * address is a multiple of 256 (the base is page aligned and every range
 * boundary a multiple of 256), no header (block = address), and the device
 * keeps nothing for itself (overhead 0: physical bytes are the live
 * footprints, plus committed pages with VMM).
 *
 * Build:  cc -shared -fPIC -O2 -I adapters/c -o libarena.so adapters/c/example_arena.c
 * ABI 1 (memspec_plugin_v1, no geometry; the loader still loads it):
 *         ... -DMEMSPEC_EXAMPLE_ABI1
 * Broken twin (must be caught by `memspec conform`):
 *         ... -DMEMSPEC_BROKEN_DOUBLE_FREE   deallocate trusts the address of
 *             a handle that is no longer live and frees it again.
 * With a VirtualBacking:
 *         ... -DMEMSPEC_EXAMPLE_VMM   the address range becomes 64x the capacity
 *             (virtual); reservations take page-aligned address space from the
 *             same free list and no physical bytes; commit/decommit install and
 *             remove 2 MiB pages within the capacity.  Physical bytes are then the
 *             live allocations' footprints plus the committed pages, walked from
 *             every instance's tables.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "memspec_plugin.h"

#define BLOCK 256u

#ifdef MEMSPEC_EXAMPLE_ABI1
typedef memspec_handle handle_t;
#else
typedef memspec_handle2 handle_t;  /* ABI 2: the handle has `block` (0 here: no header) */
#endif
#define DEFAULT_CAPACITY (256ull << 20)
#define PAGE (2ull << 20)
#ifdef MEMSPEC_EXAMPLE_VMM
#define VA_FACTOR 64u
#else
#define VA_FACTOR 1u
#endif

typedef struct range { uint64_t off, len; } range;

struct arena;

typedef struct device {
    uint64_t base, capacity, va_size;  /* va_size: the address range (capacity without VMM) */
    range *free;                      /* free address space, sorted by offset */
    size_t nfree, cap_free;
    int refs;
    struct arena *instances;          /* every instance on this device (for the physical walk) */
} device;

typedef struct live { uint64_t gen, address, size, footprint; } live;

typedef struct reservation {
    uint64_t gen, address, size;
    uint8_t *committed;  /* one flag per page */
} reservation;

typedef struct arena {
    device *dev;
    struct arena *next;  /* the device's instance list */
    uint64_t next_gen;   /* last generation issued (allocations and reservations share it) */
    live *live;
    size_t nlive, cap_live;
    reservation *res;
    size_t nres, cap_res;
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
    } else {
        device *d = calloc(1, sizeof *d);
        if (!d) { free(a); return NULL; }
        d->capacity = capacity ? capacity : DEFAULT_CAPACITY;
        d->capacity -= d->capacity % PAGE;
        d->va_size = d->capacity * VA_FACTOR;
        void *mem = d->va_size ? mmap(NULL, d->va_size, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) : NULL;
        if (mem == MAP_FAILED) { free(d); free(a); return NULL; }
        d->base = (uint64_t)(uintptr_t)mem;
        if (d->va_size && !free_range(d, 0, d->va_size)) { munmap(mem, d->va_size); free(d); free(a); return NULL; }
        a->dev = d;
    }
    a->dev->refs++;
    a->next = a->dev->instances;
    a->dev->instances = a;
    return a;
}

static void drop_pages(device *d, uint64_t address, uint64_t len) {
    /* the bytes of decommitted pages are gone (as on a device) */
    madvise((void *)(uintptr_t)address, len, MADV_DONTNEED);
    (void)d;
}

static void arena_destroy(void *self) {
    arena *a = self;
    if (!a) return;
    device *d = a->dev;
    for (arena **p = &d->instances; *p; p = &(*p)->next)
        if (*p == a) { *p = a->next; break; }
    if (--d->refs == 0) {
        if (d->va_size) munmap((void *)(uintptr_t)d->base, d->va_size);
        free(d->free);
        free(d);
    } else {  /* a twin's blocks and reservations go back to the device */
        for (size_t i = 0; i < a->nlive; i++)
            free_range(d, a->live[i].address - d->base, a->live[i].footprint);
        for (size_t i = 0; i < a->nres; i++) {
            drop_pages(d, a->res[i].address, a->res[i].size);
            free_range(d, a->res[i].address - d->base, a->res[i].size);
        }
    }
    for (size_t i = 0; i < a->nres; i++) free(a->res[i].committed);
    free(a->res);
    free(a->live);
    free(a);
}

static uint64_t arena_capacity(void *self) { return ((arena *)self)->dev->capacity; }

static inline uint64_t committed_of(const reservation *r) {
    uint64_t n = 0;
    for (uint64_t p = 0; p < r->size / PAGE; p++) n += r->committed[p] ? PAGE : 0;
    return n;
}

/* Physical bytes held: without VMM, the address space not on the free list
 * (address space is physical); with VMM, every instance's live footprints
 * plus committed pages. */
static uint64_t device_physical(device *d) {
#ifdef MEMSPEC_EXAMPLE_VMM
    uint64_t n = 0;
    for (arena *a = d->instances; a; a = a->next) {
        for (size_t i = 0; i < a->nlive; i++) n += a->live[i].footprint;
        for (size_t i = 0; i < a->nres; i++) n += committed_of(&a->res[i]);
    }
    return n;
#else
    uint64_t f = 0;
    for (size_t i = 0; i < d->nfree; i++) f += d->free[i].len;
    return d->va_size - f;
#endif
}

static uint64_t arena_physical_bytes(void *self) { return device_physical(((arena *)self)->dev); }

static const char *arena_last_error(void *self) { return ((arena *)self)->err; }

static void arena_memory(void *self, uint64_t *base, uint64_t *size) {
    *base = ((arena *)self)->dev->base;
    *size = ((arena *)self)->dev->va_size;
}

/* First fit of `len` bytes at `alignment` in the free address space; the
 * offset in *off.  0 when nothing fits (or no host memory for the list). */
static int take_range(device *d, uint64_t len, uint64_t alignment, uint64_t *off) {
    for (size_t i = 0; i < d->nfree; i++) {
        range *r = &d->free[i];
        uint64_t addr = d->base + r->off;
        uint64_t aligned = (addr + alignment - 1) / alignment * alignment;
        uint64_t pad = aligned - addr;
        if (pad > r->len || r->len - pad < len) continue;
        uint64_t start = r->off + pad, rest = r->len - pad - len;
        if (pad) {          /* keep the head, then the tail */
            r->len = pad;
            if (rest && !free_range(d, start + len, rest)) {
                d->free[i].len = pad + len + rest;
                return 0;
            }
        } else if (rest) {
            r->off += len;
            r->len = rest;
        } else {
            memmove(r, r + 1, (d->nfree - i - 1) * sizeof(range));
            d->nfree--;
        }
        *off = start;
        return 1;
    }
    return 0;
}

static int32_t arena_allocate(void *self, int64_t size, uint64_t alignment, handle_t *out) {
    arena *a = self;
    device *d = a->dev;
    if (size <= 0) return fail(a, MEMSPEC_ERR_INVALID_REQUEST, "size must be positive");
    if (alignment == 0 || (alignment & (alignment - 1))) return fail(a, MEMSPEC_ERR_INVALID_REQUEST, "alignment must be a power of two");
    if ((uint64_t)size > d->capacity) return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "larger than the device");
    uint64_t fp = ((uint64_t)size + BLOCK - 1) / BLOCK * BLOCK, off;
#ifdef MEMSPEC_EXAMPLE_VMM
    if (device_physical(d) + fp > d->capacity) return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no physical capacity left");
#endif
    if (!grow((void **)&a->live, &a->cap_live, a->nlive + 1, sizeof(live)))
        return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no host memory for the live table");
    if (!take_range(d, fp, alignment, &off)) return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no free range fits");
    live *l = &a->live[a->nlive++];
    l->gen = ++a->next_gen;
    l->address = d->base + off;
    l->size = (uint64_t)size;
    l->footprint = fp;
    out->owner = (uint64_t)(uintptr_t)a;
    out->generation = l->gen;
    out->address = l->address;
    out->size = (uint64_t)size;
    out->footprint = fp;
#ifndef MEMSPEC_EXAMPLE_ABI1
    out->block = 0;  /* the block starts at the address: no header */
#endif
    return MEMSPEC_OK;
}

static int32_t arena_deallocate(void *self, const handle_t *h, uint64_t *freed) {
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

#ifdef MEMSPEC_EXAMPLE_VMM
/* ---- VirtualBacking ------------------------------------------------------ */

static uint64_t vb_granularity(void *self) { (void)self; return PAGE; }

static int32_t vb_reserve(void *self, int64_t size, uint64_t alignment, handle_t *out) {
    arena *a = self;
    device *d = a->dev;
    if (size <= 0) return fail(a, MEMSPEC_ERR_INVALID_REQUEST, "size must be positive");
    if (alignment & (alignment - 1)) return fail(a, MEMSPEC_ERR_INVALID_REQUEST, "alignment must be a power of two");
    if ((uint64_t)size > d->capacity) return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "larger than the device");
    uint64_t len = ((uint64_t)size + PAGE - 1) / PAGE * PAGE, off;
    uint8_t *flags = calloc(len / PAGE, 1);
    if (!flags || !grow((void **)&a->res, &a->cap_res, a->nres + 1, sizeof(reservation))) {
        free(flags);
        return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no host memory for the reservation table");
    }
    if (!take_range(d, len, alignment > PAGE ? alignment : PAGE, &off)) {
        free(flags);
        return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no address space left");
    }
    reservation *r = &a->res[a->nres++];
    r->gen = ++a->next_gen;
    r->address = d->base + off;
    r->size = len;
    r->committed = flags;
    out->owner = (uint64_t)(uintptr_t)a;
    out->generation = r->gen;
    out->address = r->address;
    out->size = len;
    out->footprint = 0;
#ifndef MEMSPEC_EXAMPLE_ABI1
    out->block = 0;
#endif
    return MEMSPEC_OK;
}

static int32_t find_res(arena *a, const handle_t *h, size_t *index) {
    if (h->owner != (uint64_t)(uintptr_t)a) return fail(a, MEMSPEC_ERR_FOREIGN_ALLOCATION, "made by another instance");
    for (size_t i = 0; i < a->nres; i++) {
        if (a->res[i].gen != h->generation) continue;
        if (a->res[i].address != h->address) return fail(a, MEMSPEC_ERR_STALE_HANDLE, "handle fields do not match");
        *index = i;
        return MEMSPEC_OK;
    }
    if (h->generation >= 1 && h->generation <= a->next_gen) return fail(a, MEMSPEC_ERR_DOUBLE_FREE, "reservation released");
    return fail(a, MEMSPEC_ERR_STALE_HANDLE, "never issued by this instance");
}

static int range_ok(const reservation *r, uint64_t start, uint64_t end) {
    return start < end && start % PAGE == 0 && end % PAGE == 0 && end <= r->size;
}

static int32_t vb_commit(void *self, const handle_t *h, uint64_t start, uint64_t end, uint64_t *committed) {
    arena *a = self;
    size_t i;
    int32_t st = find_res(a, h, &i);
    if (st) return st;
    reservation *r = &a->res[i];
    if (!range_ok(r, start, end)) return fail(a, MEMSPEC_ERR_INVALID_RANGE, "misaligned, empty, reversed or past the end");
    for (uint64_t p = start / PAGE; p < end / PAGE; p++)
        if (r->committed[p]) return fail(a, MEMSPEC_ERR_INVALID_RANGE, "a page of the range is already committed");
    if (device_physical(a->dev) + (end - start) > a->dev->capacity)
        return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no physical capacity left");
    for (uint64_t p = start / PAGE; p < end / PAGE; p++) r->committed[p] = 1;
    *committed = end - start;
    return MEMSPEC_OK;
}

static int32_t vb_decommit(void *self, const handle_t *h, uint64_t start, uint64_t end, uint64_t *released) {
    arena *a = self;
    size_t i;
    int32_t st = find_res(a, h, &i);
    if (st) return st;
    reservation *r = &a->res[i];
    if (!range_ok(r, start, end)) return fail(a, MEMSPEC_ERR_INVALID_RANGE, "misaligned, empty, reversed or past the end");
    for (uint64_t p = start / PAGE; p < end / PAGE; p++)
        if (!r->committed[p]) return fail(a, MEMSPEC_ERR_INVALID_RANGE, "a page of the range is not committed");
    for (uint64_t p = start / PAGE; p < end / PAGE; p++) r->committed[p] = 0;
    drop_pages(a->dev, r->address + start, end - start);
    *released = end - start;
    return MEMSPEC_OK;
}

static int32_t vb_committed_bytes(void *self, const handle_t *h, uint64_t *out) {
    arena *a = self;
    size_t i;
    int32_t st = find_res(a, h, &i);
    if (st) return st;
    *out = committed_of(&a->res[i]);
    return MEMSPEC_OK;
}

static int32_t vb_release(void *self, const handle_t *h, uint64_t *released) {
    arena *a = self;
    size_t i;
    int32_t st = find_res(a, h, &i);
    if (st) return st;
    reservation r = a->res[i];
    if (!free_range(a->dev, r.address - a->dev->base, r.size))
        return fail(a, MEMSPEC_ERR_OUT_OF_MEMORY, "no host memory for the free list");
    *released = committed_of(&r);
    drop_pages(a->dev, r.address, r.size);
    free(r.committed);
    a->res[i] = a->res[--a->nres];
    return MEMSPEC_OK;
}
#endif

#ifndef MEMSPEC_EXAMPLE_ABI1
/* ABI 2: what this arena promises about its packing (see the top of the file). */
static void arena_geometry(void *self, memspec_geometry *g) {
    (void)self;
    g->unit = BLOCK;                 /* footprints are multiples of 256 bytes */
    g->alignment = BLOCK;            /* every address is a multiple of 256 */
    g->bound = MEMSPEC_BOUND_UNIT;   /* the footprint is the request rounded up to the unit, no more */
    g->header = 0;                   /* nothing in band: block = address */
    g->overhead = 0;                 /* physical bytes are the live footprints (+ committed pages) */
}

static const memspec_plugin2 PLUGIN = {
    .abi_version = MEMSPEC_PLUGIN_ABI_VERSION_2,
#else
static const memspec_plugin PLUGIN = {
    .abi_version = MEMSPEC_PLUGIN_ABI_VERSION,
#endif
#if defined(MEMSPEC_BROKEN_DOUBLE_FREE)
    .name = "example-arena-broken",
#elif defined(MEMSPEC_EXAMPLE_VMM)
    .name = "example-arena-vmm",
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
#ifdef MEMSPEC_EXAMPLE_VMM
    .vb_granularity = vb_granularity,
    .vb_reserve = vb_reserve,
    .vb_commit = vb_commit,
    .vb_decommit = vb_decommit,
    .vb_committed_bytes = vb_committed_bytes,
    .vb_release = vb_release,
#endif
#ifndef MEMSPEC_EXAMPLE_ABI1
    .geometry = arena_geometry,
#endif
};

#ifdef MEMSPEC_EXAMPLE_ABI1
const memspec_plugin *memspec_plugin_v1(void) { return &PLUGIN; }
#else
const memspec_plugin2 *memspec_plugin_v2(void) { return &PLUGIN; }
#endif
