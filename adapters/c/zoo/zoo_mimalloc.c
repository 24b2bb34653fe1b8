/*
 * zoo_mimalloc.c -- mimalloc 2 (Debian's libmimalloc2.0) through the memspec
 * C ABI (written with memspec_kit.h).
 *
 * mimalloc can manage a fixed region as its arena: each device is an
 * anonymous mapping (MAP_NORESERVE, aligned to mimalloc's 32 MiB segments)
 * given to mi_manage_os_memory_ex as an *exclusive* arena, and a heap made
 * with mi_heap_new_in_arena allocates only from it.  So the device has a real
 * capacity and a real memory range: mi_arena_area's answer.  mimalloc cannot
 * forget an arena (and keeps at most 64), so a closed device's arena goes to
 * a pool and the next device of the same capacity reuses it with a new
 * heap.  Requests for capacity 0 get 256 MiB; others are rounded up to
 * whole 32 MiB arena blocks.
 *
 * Footprint: the block mimalloc carved for the allocation: the heap's page
 * holding the pointer (mi_heap_visit_blocks, areas only) gives the block
 * start (blocks + k * block size) and the block size; an aligned allocation
 * may start inside its block (block = that start).  When no page holds the
 * pointer, mi_usable_size from the address.  No geometry declared; no
 * physical probe (mimalloc has no per-arena figure).
 *
 * A mimalloc heap belongs to the thread that made it: the ABI's callers
 * call one instance from one thread.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "memspec_kit.h"
#include "zoo_common.h"

#define SEGMENT (32ull << 20)
#define DEFAULT_CAPACITY (256ull << 20)
#define POOL 48

typedef int mi_arena_id_t;
typedef struct mi_heap_s mi_heap_t;
typedef struct mi_heap_area_s {
    void *blocks;
    size_t reserved, committed, used, block_size, full_block_size;
} mi_heap_area_t;
typedef bool(mi_block_visit_fun)(const mi_heap_t *, const mi_heap_area_t *, void *, size_t, void *);

static bool (*p_mi_manage_os_memory_ex)(void *, size_t, bool, bool, bool, int, bool, mi_arena_id_t *);
static mi_heap_t *(*p_mi_heap_new_in_arena)(mi_arena_id_t);
static void *(*p_mi_heap_malloc_aligned)(mi_heap_t *, size_t, size_t);
static void (*p_mi_free)(void *);
static size_t (*p_mi_usable_size)(const void *);
static void (*p_mi_heap_destroy)(mi_heap_t *);
static bool (*p_mi_heap_visit_blocks)(const mi_heap_t *, bool, mi_block_visit_fun *, void *);
static void *(*p_mi_arena_area)(mi_arena_id_t, size_t *);

typedef struct arena { void *base; size_t size; uint64_t asked; mi_arena_id_t id; int in_use; } arena;
static arena pool[POOL];
static int npool;

typedef struct device { arena *a; mi_heap_t *heap; } device;

static void *m_open(uint64_t capacity, char *err, size_t errlen) {
    static const char *const sonames[] = {"libmimalloc.so.2", NULL};
    if (!p_mi_heap_new_in_arena) {
        void *lib = zoo_open(sonames, err, errlen);
        if (!lib || !ZOO_SYM(lib, mi_manage_os_memory_ex, err, errlen) || !ZOO_SYM(lib, mi_heap_malloc_aligned, err, errlen)
            || !ZOO_SYM(lib, mi_free, err, errlen) || !ZOO_SYM(lib, mi_usable_size, err, errlen)
            || !ZOO_SYM(lib, mi_heap_destroy, err, errlen) || !ZOO_SYM(lib, mi_heap_visit_blocks, err, errlen)
            || !ZOO_SYM(lib, mi_arena_area, err, errlen) || !ZOO_SYM(lib, mi_heap_new_in_arena, err, errlen))
            return NULL;
    }
    uint64_t asked = capacity ? capacity : DEFAULT_CAPACITY;
    uint64_t size = (asked + SEGMENT - 1) / SEGMENT * SEGMENT;
    arena *a = NULL;
    for (int i = 0; i < npool && !a; i++)
        if (!pool[i].in_use && pool[i].asked == size) a = &pool[i];
    if (!a) {
        if (npool == POOL) { snprintf(err, errlen, "%d mimalloc arenas in use (mimalloc cannot forget one)", POOL); return NULL; }
        size_t len = size + SEGMENT;   /* over-map, then use a segment-aligned part */
        uint8_t *raw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED) { snprintf(err, errlen, "mmap of %zu bytes failed", len); return NULL; }
        uint8_t *base = (uint8_t *)(((uintptr_t)raw + SEGMENT - 1) / SEGMENT * SEGMENT);
        mi_arena_id_t id = 0;
        if (!p_mi_manage_os_memory_ex(base, size, true, false, true, -1, true, &id)) {
            munmap(raw, len);
            snprintf(err, errlen, "mi_manage_os_memory_ex(%llu bytes) refused the region", (unsigned long long)size);
            return NULL;
        }
        size_t area = 0;
        void *start = p_mi_arena_area(id, &area);
        a = &pool[npool++];
        a->base = start ? start : base;
        a->size = start ? area : size;
        a->asked = size;
        a->id = id;
    }
    device *d = calloc(1, sizeof *d);
    if (!d) { snprintf(err, errlen, "no host memory"); return NULL; }
    d->heap = p_mi_heap_new_in_arena(a->id);
    if (!d->heap) { free(d); snprintf(err, errlen, "mi_heap_new_in_arena failed"); return NULL; }
    a->in_use = 1;
    d->a = a;
    return d;
}

static void m_close(void *dev) {
    device *d = dev;
    p_mi_heap_destroy(d->heap);  /* every block was freed by the kit already: its pages go back to the arena */
    d->a->in_use = 0;
    free(d);
}

static uint64_t m_capacity(void *dev) { return ((device *)dev)->a->size; }

typedef struct find { uint64_t p, block, size; } find;

static bool visit(const mi_heap_t *h, const mi_heap_area_t *area, void *block, size_t size, void *arg) {
    (void)h; (void)block; (void)size;
    find *f = arg;
    uint64_t start = (uint64_t)(uintptr_t)area->blocks;
    size_t stride = area->full_block_size >= area->block_size && area->full_block_size ? area->full_block_size : area->block_size;
    if (!stride || f->p < start || f->p >= start + area->reserved) return true;
    f->block = start + (f->p - start) / stride * stride;
    f->size = area->block_size;
    return false;   /* found: stop */
}

static int32_t m_alloc(void *dev, uint64_t size, uint64_t alignment, memspec_kit_block *out, char *err, size_t errlen) {
    device *d = dev;
    void *p = p_mi_heap_malloc_aligned(d->heap, size, alignment);
    if (!p) { snprintf(err, errlen, "mi_heap_malloc_aligned(%llu, %llu) returned NULL", (unsigned long long)size, (unsigned long long)alignment); return MEMSPEC_ERR_OUT_OF_MEMORY; }
    uint64_t a = (uint64_t)(uintptr_t)p;
    find f = {a, 0, 0};
    p_mi_heap_visit_blocks(d->heap, false, visit, &f);
    out->address = a;
    if (f.size && f.block <= a && a < f.block + f.size) {
        out->block = f.block == a ? 0 : f.block;
        out->footprint = f.size;
    } else {
        out->block = 0;
        out->footprint = p_mi_usable_size(p);
    }
    return MEMSPEC_OK;
}

static void m_free(void *dev, const memspec_kit_block *b) { (void)dev; p_mi_free((void *)(uintptr_t)b->address); }

static void m_memory(void *dev, uint64_t *base, uint64_t *size) {
    device *d = dev;
    *base = (uint64_t)(uintptr_t)d->a->base;
    *size = d->a->size;
}

static const memspec_kit_ops OPS = {
    .name = "zoo-mimalloc",
    .open = m_open, .close = m_close, .capacity = m_capacity, .alloc = m_alloc, .free = m_free,
    .memory = m_memory,
};

MEMSPEC_KIT_PLUGIN(OPS)
