/*
 * memspec_kit.h -- header-only kit for memspec C plugins (ABI 2).
 *
 * With it a plugin author writes what is the allocator's own -- open a
 * device, allocate, free -- and nothing else.  The kit keeps:
 *
 *   - identity: a handle table per instance (owner = the instance, one
 *     generation per allocation, counted from 1 and never reused); a handle
 *     is refused FOREIGN_ALLOCATION when another instance made it,
 *     DOUBLE_FREE when its generation was issued and is no longer live,
 *     STALE_HANDLE when its generation was never issued or its fields
 *     (address, size, footprint, block) differ from the live allocation's --
 *     whatever the address, so a recycled address never revives a stale
 *     handle;
 *   - instances and devices: create(capacity, NULL) opens a device,
 *     create(0, share_with) a foreign twin on share_with's device; destroy
 *     frees what the instance still holds and closes the device with its
 *     last instance;
 *   - the checks every plugin needs: size <= 0 and an alignment that is not
 *     a power of two are INVALID_REQUEST, a size above the capacity is
 *     OUT_OF_MEMORY before the allocator is asked;
 *   - optionally a budget (MEMSPEC_KIT_BUDGET): for an allocator with no
 *     capacity of its own (malloc), the device's capacity is a budget on the
 *     live footprints -- an allocation that would pass it is freed again and
 *     refused OUT_OF_MEMORY ("the device is full"), as a device would;
 *   - the ABI table (memspec_plugin_v2), built from the ops you give.
 *
 * ---- Using it -----------------------------------------------------------
 *
 *     #include "memspec_kit.h"
 *
 *     static void *my_open(uint64_t capacity, char *err, size_t errlen);   // a device; NULL + err on failure
 *     static void my_close(void *dev);
 *     static uint64_t my_capacity(void *dev);
 *     static int32_t my_alloc(void *dev, uint64_t size, uint64_t alignment,
 *                             memspec_kit_block *out, char *err, size_t errlen);
 *     static void my_free(void *dev, const memspec_kit_block *b);
 *
 *     static const memspec_kit_ops OPS = {
 *         .name = "my-allocator", .open = my_open, .close = my_close,
 *         .capacity = my_capacity, .alloc = my_alloc, .free = my_free,
 *         // optional: .physical_bytes, .memory, .geometry, .flags, .budget
 *     };
 *     MEMSPEC_KIT_PLUGIN(OPS)
 *
 * alloc is called with size >= 1 and <= the capacity, alignment a power of
 * two.  On MEMSPEC_OK it fills the block:
 *
 *   address    what the caller gets: aligned to `alignment`;
 *   footprint  the bytes the allocation really takes (its size class or
 *              usable size, plus its in-band header if any), counted from
 *              `block`: the truth the allocator knows, never a figure fitted
 *              to what the suite expects;
 *   block      where those bytes start, 0 when at `address` (an allocator
 *              that keeps a header in front of the address sets it: the
 *              header's first byte);
 *   cookie     anything the allocator wants back in free (e.g. the pointer
 *              its free takes, when that is not the address).
 *
 * The suite writes only into [address, address + size) of live allocations
 * and reads it back later, so an in-band header in [block, address) must
 * survive the caller's writes and is the allocator's to use.  free gets the
 * very block alloc gave.  Errors: return a memspec_status and write a
 * message into err (alloc: OUT_OF_MEMORY when the library says no room).
 *
 * ---- A size-class allocator with an in-band header (worked example) ----
 *
 * Classes 32, 64, ..., 2^k bytes, header included; a 16-byte header in front
 * of every address holds the block's class; free blocks stay on per-class
 * lists (example_classes.c next to this header is the whole plugin):
 *
 *     alloc(size = 100, alignment = 16):
 *         class = 128 (100 + 16 header <= 128)
 *         block = a free 128-byte block, or the next 128 bytes of the region
 *         address = block + 16;  *(header *)block = class
 *         out = { .address = block + 16, .footprint = 128, .block = block }
 *
 *     geometry: unit 16, alignment 16, bound CLASSES with header 16 and
 *     classes {32, 64, ..., 2^k}: the most footprint for 100 bytes is the
 *     smallest class >= 116, 128; for an alignment above 16 the bound adds
 *     alignment - 16; overhead undeclared (the free lists keep what was
 *     freed: physical bytes above the live footprints are measured, not
 *     failed).
 *
 * Threads: one instance is called from one thread at a time (the ABI's
 * rule); instances of one device may be called from different threads, so
 * the kit takes no lock and an allocator whose device is shared by twins
 * must be safe for that itself.
 */
#ifndef MEMSPEC_KIT_H
#define MEMSPEC_KIT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memspec_plugin.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the handle table (usable on its own) -------------------------------- */

typedef struct memspec_kit_entry {
    uint64_t generation, address, size, footprint, block;
    void *cookie;
} memspec_kit_entry;

/* One instance's live allocations, sorted by generation. */
typedef struct memspec_kit_table {
    uint64_t owner;            /* nonzero: the instance */
    uint64_t last_generation;  /* the last one issued */
    memspec_kit_entry *e;
    size_t n, cap;
} memspec_kit_table;

static inline void memspec_kit_table_init(memspec_kit_table *t, uint64_t owner) {
    memset(t, 0, sizeof *t);
    t->owner = owner;
}

static inline void memspec_kit_table_fini(memspec_kit_table *t) {
    free(t->e);
    t->e = NULL;
    t->n = t->cap = 0;
}

/* A new live entry with the next generation, and its handle in *out.
 * OUT_OF_MEMORY (nothing changed) when the table cannot grow. */
static inline int32_t memspec_kit_table_add(memspec_kit_table *t, uint64_t address, uint64_t size,
                                            uint64_t footprint, uint64_t block, void *cookie,
                                            memspec_handle2 *out) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        memspec_kit_entry *e = (memspec_kit_entry *)realloc(t->e, cap * sizeof *e);
        if (!e) return MEMSPEC_ERR_OUT_OF_MEMORY;
        t->e = e;
        t->cap = cap;
    }
    memspec_kit_entry *x = &t->e[t->n++];
    x->generation = ++t->last_generation;
    x->address = address;
    x->size = size;
    x->footprint = footprint;
    x->block = block;
    x->cookie = cookie;
    out->owner = t->owner;
    out->generation = x->generation;
    out->address = address;
    out->size = size;
    out->footprint = footprint;
    out->block = block;
    return MEMSPEC_OK;
}

/* The live entry a handle names, in *index; otherwise the refusal and *why:
 * FOREIGN_ALLOCATION (another owner), DOUBLE_FREE (issued, no longer live),
 * STALE_HANDLE (never issued, or fields that differ from the live entry's). */
static inline int32_t memspec_kit_table_find(const memspec_kit_table *t, const memspec_handle2 *h, size_t *index,
                                             const char **why) {
    if (h->owner != t->owner) {
        *why = "made by another instance";
        return MEMSPEC_ERR_FOREIGN_ALLOCATION;
    }
    if (h->generation == 0 || h->generation > t->last_generation) {
        *why = "never issued by this instance";
        return MEMSPEC_ERR_STALE_HANDLE;
    }
    size_t lo = 0, hi = t->n;  /* generations ascend: binary search */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->e[mid].generation < h->generation) lo = mid + 1;
        else hi = mid;
    }
    if (lo == t->n || t->e[lo].generation != h->generation) {
        *why = "already freed";
        return MEMSPEC_ERR_DOUBLE_FREE;
    }
    const memspec_kit_entry *x = &t->e[lo];
    if (x->address != h->address || x->size != h->size || x->footprint != h->footprint || x->block != h->block) {
        *why = "handle fields do not match the live allocation";
        return MEMSPEC_ERR_STALE_HANDLE;
    }
    *index = lo;
    return MEMSPEC_OK;
}

static inline void memspec_kit_table_remove(memspec_kit_table *t, size_t index) {
    memmove(&t->e[index], &t->e[index + 1], (t->n - index - 1) * sizeof *t->e);
    t->n--;
}

/* ---- the plugin scaffolding --------------------------------------------- */

typedef struct memspec_kit_block {
    uint64_t address;    /* the caller's first byte */
    uint64_t footprint;  /* bytes really taken, counted from block */
    uint64_t block;      /* where they start; 0: at address */
    void *cookie;        /* the allocator's own, given back to free */
} memspec_kit_block;

#define MEMSPEC_KIT_BUDGET 1  /* memspec_kit_ops.budget: capacity is a budget on live footprints */

typedef struct memspec_kit_ops {
    const char *name;
    /* required */
    void *(*open)(uint64_t capacity, char *err, size_t errlen);  /* capacity 0: the allocator's default */
    void (*close)(void *dev);
    uint64_t (*capacity)(void *dev);
    int32_t (*alloc)(void *dev, uint64_t size, uint64_t alignment, memspec_kit_block *out, char *err, size_t errlen);
    void (*free)(void *dev, const memspec_kit_block *b);
    /* optional (NULL: absent) */
    uint64_t (*physical_bytes)(void *dev);
    void (*memory)(void *dev, uint64_t *base, uint64_t *size);
    void (*geometry)(void *dev, memspec_geometry *g);
    uint64_t flags;  /* MEMSPEC_HOST_POINTERS */
    int budget;      /* MEMSPEC_KIT_BUDGET, or 0 */
} memspec_kit_ops;

typedef struct memspec_kit_device {
    const memspec_kit_ops *ops;
    void *dev;
    uint64_t capacity;
    uint64_t live_footprint;  /* every instance's live footprints (the budget) */
    int refs;
} memspec_kit_device;

typedef struct memspec_kit_instance {
    memspec_kit_device *d;
    memspec_kit_table table;
    char err[200];
} memspec_kit_instance;

static inline int32_t memspec_kit_fail(memspec_kit_instance *k, int32_t code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(k->err, sizeof k->err, fmt, ap);
    va_end(ap);
    return code;
}

static inline void *memspec_kit_create(const memspec_kit_ops *ops, uint64_t capacity, void *share_with) {
    memspec_kit_instance *k = (memspec_kit_instance *)calloc(1, sizeof *k);
    if (!k) return NULL;
    if (share_with) {
        k->d = ((memspec_kit_instance *)share_with)->d;
    } else {
        memspec_kit_device *d = (memspec_kit_device *)calloc(1, sizeof *d);
        if (!d) { free(k); return NULL; }
        d->ops = ops;
        d->dev = ops->open(capacity, k->err, sizeof k->err);
        if (!d->dev) {
            fprintf(stderr, "%s: cannot open a device: %s\n", ops->name, k->err);
            free(d);
            free(k);
            return NULL;
        }
        d->capacity = ops->capacity(d->dev);
        k->d = d;
    }
    k->d->refs++;
    memspec_kit_table_init(&k->table, (uint64_t)(uintptr_t)k);
    return k;
}

static inline void memspec_kit_destroy(void *self) {
    memspec_kit_instance *k = (memspec_kit_instance *)self;
    if (!k) return;
    memspec_kit_device *d = k->d;
    for (size_t i = 0; i < k->table.n; i++) {  /* what it still holds goes back to the device */
        memspec_kit_block b = {k->table.e[i].address, k->table.e[i].footprint, k->table.e[i].block,
                               k->table.e[i].cookie};
        d->ops->free(d->dev, &b);
        d->live_footprint -= b.footprint;
    }
    memspec_kit_table_fini(&k->table);
    if (--d->refs == 0) {
        d->ops->close(d->dev);
        free(d);
    }
    free(k);
}

static inline uint64_t memspec_kit_capacity(void *self) { return ((memspec_kit_instance *)self)->d->capacity; }

static inline uint64_t memspec_kit_physical_bytes(void *self) {
    memspec_kit_device *d = ((memspec_kit_instance *)self)->d;
    return d->ops->physical_bytes(d->dev);
}

static inline const char *memspec_kit_last_error(void *self) { return ((memspec_kit_instance *)self)->err; }

static inline void memspec_kit_memory(void *self, uint64_t *base, uint64_t *size) {
    memspec_kit_device *d = ((memspec_kit_instance *)self)->d;
    d->ops->memory(d->dev, base, size);
}

static inline void memspec_kit_geometry(void *self, memspec_geometry *g) {
    memspec_kit_device *d = ((memspec_kit_instance *)self)->d;
    d->ops->geometry(d->dev, g);
}

static inline int32_t memspec_kit_allocate(void *self, int64_t size, uint64_t alignment, memspec_handle2 *out) {
    memspec_kit_instance *k = (memspec_kit_instance *)self;
    memspec_kit_device *d = k->d;
    if (size <= 0) return memspec_kit_fail(k, MEMSPEC_ERR_INVALID_REQUEST, "size %lld is not positive", (long long)size);
    if (alignment == 0 || (alignment & (alignment - 1)))
        return memspec_kit_fail(k, MEMSPEC_ERR_INVALID_REQUEST, "alignment %llu is not a power of two",
                                (unsigned long long)alignment);
    if ((uint64_t)size > d->capacity)
        return memspec_kit_fail(k, MEMSPEC_ERR_OUT_OF_MEMORY, "%lld bytes: larger than the device (%llu)",
                                (long long)size, (unsigned long long)d->capacity);
    memspec_kit_block b = {0, 0, 0, NULL};
    k->err[0] = 0;
    int32_t st = d->ops->alloc(d->dev, (uint64_t)size, alignment, &b, k->err, sizeof k->err);
    if (st != MEMSPEC_OK) {
        if (!k->err[0]) memspec_kit_fail(k, st, "%s refused %lld bytes", d->ops->name, (long long)size);
        return st;
    }
    if (d->ops->budget && (b.footprint > d->capacity || d->live_footprint > d->capacity - b.footprint)) {
        d->ops->free(d->dev, &b);
        return memspec_kit_fail(k, MEMSPEC_ERR_OUT_OF_MEMORY,
                                "the device is full: %llu of %llu bytes live, this one takes %llu",
                                (unsigned long long)d->live_footprint, (unsigned long long)d->capacity,
                                (unsigned long long)b.footprint);
    }
    st = memspec_kit_table_add(&k->table, b.address, (uint64_t)size, b.footprint, b.block, b.cookie, out);
    if (st != MEMSPEC_OK) {
        d->ops->free(d->dev, &b);
        return memspec_kit_fail(k, st, "no host memory for the handle table");
    }
    d->live_footprint += b.footprint;
    return MEMSPEC_OK;
}

static inline int32_t memspec_kit_deallocate(void *self, const memspec_handle2 *h, uint64_t *freed) {
    memspec_kit_instance *k = (memspec_kit_instance *)self;
    size_t i = 0;
    const char *why = "";
    int32_t st = memspec_kit_table_find(&k->table, h, &i, &why);
    if (st != MEMSPEC_OK) return memspec_kit_fail(k, st, "%s", why);
    memspec_kit_entry x = k->table.e[i];
    memspec_kit_block b = {x.address, x.footprint, x.block, x.cookie};
    k->d->ops->free(k->d->dev, &b);
    k->d->live_footprint -= x.footprint;
    memspec_kit_table_remove(&k->table, i);
    *freed = x.footprint;
    return MEMSPEC_OK;
}

/* Fill an ABI-2 table from the ops (the optional entries NULL where the ops have none). */
static inline void memspec_kit_fill(memspec_plugin2 *t, const memspec_kit_ops *ops,
                                    void *(*create)(uint64_t, void *)) {
    memset(t, 0, sizeof *t);
    t->name = ops->name;
    t->create = create;
    t->destroy = memspec_kit_destroy;
    t->capacity = memspec_kit_capacity;
    t->physical_bytes = ops->physical_bytes ? memspec_kit_physical_bytes : NULL;
    t->last_error = memspec_kit_last_error;
    t->memory = ops->memory ? memspec_kit_memory : NULL;
    t->allocate = memspec_kit_allocate;
    t->deallocate = memspec_kit_deallocate;
    t->geometry = ops->geometry ? memspec_kit_geometry : NULL;
    t->flags = ops->flags;
    t->abi_version = MEMSPEC_PLUGIN_ABI_VERSION_2;  /* last: a filled table */
}

/* The plugin's one export, from a memspec_kit_ops named OPS. */
#define MEMSPEC_KIT_PLUGIN(OPS)                                                              \
    static void *memspec_kit__create(uint64_t capacity, void *share_with) {                  \
        return memspec_kit_create(&(OPS), capacity, share_with);                             \
    }                                                                                        \
    const memspec_plugin2 *memspec_plugin_v2(void) {                                         \
        static memspec_plugin2 table;                                                        \
        if (table.abi_version != MEMSPEC_PLUGIN_ABI_VERSION_2)                               \
            memspec_kit_fill(&table, &(OPS), memspec_kit__create);                           \
        return &table;                                                                       \
    }

#ifdef __cplusplus
}
#endif

#endif /* MEMSPEC_KIT_H */
