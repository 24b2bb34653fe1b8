/*
 * memspec_plugin.h -- the C ABI of memspec allocator plugins (ABI versions 1 and 2).
 *
 * A plugin is a shared library exporting one function,
 *
 *     const memspec_plugin2 *memspec_plugin_v2(void);     (ABI 2, preferred)
 *     const memspec_plugin  *memspec_plugin_v1(void);     (ABI 1, still loaded)
 *
 * that returns a table of entry points.  `memspec conform c:path/to/lib.so`
 * loads it (memspec.adapters.c_plugin: it tries memspec_plugin_v2, then
 * memspec_plugin_v1) and runs the conformance suite on it as a seed-000
 * DeviceMemoryMechanism:
 *
 *   - DeviceAllocator (required): allocate / deallocate;
 *   - VirtualBacking (optional): vb_* -- all set, or all NULL (absent);
 *   - SharedMapping (optional): sm_* -- all set, or all NULL (absent).
 *
 * Most plugins need none of the table's plumbing: memspec_kit.h (next to this
 * header) keeps the handles (owner, generations, stale/double/foreign frees),
 * the instances and the device, and a plugin writes its allocate and free.
 *
 * Seed 000: "when a capability is unsupported, return an explicit absence or
 * error rather than a successful no-op" -- leave the pointers NULL; the loader
 * then answers None for the capability.
 *
 * ABI 2 is ABI 1 with three additions, all optional to use:
 *   - memspec_handle2: the handle gains `block` (where the allocator's block
 *     for an allocation starts when that is not its address: an in-band
 *     header, alignment padding taken in front);
 *   - `geometry`: the allocator declares how it packs memory (unit,
 *     alignment, most footprint per request, overhead) -- what it declares
 *     the suite holds it to, what it leaves undeclared is measured and
 *     reported as a quality figure, never a FAIL;
 *   - `flags`: MEMSPEC_HOST_POINTERS -- the addresses are host pointers into
 *     no one region (malloc-style allocators); the loader's EP then reads and
 *     writes only inside live allocations.
 *
 * ---- The allocate contract --------------------------------------------------
 *
 * allocate(self, size, alignment, out) is called with size > 0 (a size <= 0
 * must be refused: INVALID_REQUEST) and alignment a power of two (anything
 * else: INVALID_REQUEST).  On MEMSPEC_OK it fills the handle:
 *
 *   address    the first byte the caller may use; a multiple of `alignment`
 *              (and of the declared geometry alignment);
 *   size       the size asked for;
 *   footprint  the physical bytes this allocation really takes from the
 *              device -- the truth the allocator knows (its block or size
 *              class: malloc_usable_size, plus an in-band header), counted
 *              from `block`; footprint >= size, and [address, address+size)
 *              lies inside [block, block + footprint);
 *   block      (ABI 2) where those footprint bytes start; 0: at `address`.
 *              Two live allocations' [block, block + footprint) never overlap.
 *
 * deallocate gives back *freed = the footprint it reported.  The suite writes
 * a pattern only into [address, address + size) of live allocations (through
 * the loader's EP, when `memory` or MEMSPEC_HOST_POINTERS says where the host
 * can reach them), reads it back later and expects it intact: an allocator's
 * in-band header must lie outside [address, address + size).
 *
 * OUT_OF_MEMORY is the answer when the footprint does not fit.  Whether an
 * OOM is a defect depends on what the plugin declares: with a declared bound
 * (memspec_geometry.bound) and overhead, an OOM on an empty device for a
 * request whose bound fits the capacity less the overhead is a FAIL; with
 * nothing declared it is a measured quality figure.
 *
 * Handles.  Every object the plugin hands out is described by a
 * memspec_handle (ABI 2: memspec_handle2).  `owner` names the plugin instance
 * that made it (any nonzero value the plugin chooses, e.g. its address) and
 * `generation` counts that instance's handles from 1, never reused.  The
 * loader passes the very fields back on every later call; the plugin decides
 * from them whether the handle is foreign (owner differs), freed (generation
 * no longer live) or stale, whatever the address -- a recycled address must
 * not make a stale handle valid.  (memspec_kit.h does all of this.)
 *
 * Errors.  Every call returns a memspec_status; MEMSPEC_OK and the outputs
 * written, or an error and nothing changed ("on error nothing stays
 * committed").  Each status is one class of memspec.spec.errors (below).
 * `last_error` (optional) gives a message for the instance's last failure.
 *
 * Threads.  The loader calls one instance from one thread at a time.
 * Memory.  Addresses are device addresses: the loader dereferences them only
 * inside the range `memory` declares (checked to be mapped, readable and
 * writable when the target is made), or with MEMSPEC_HOST_POINTERS only
 * inside live allocations; otherwise never.
 */
#ifndef MEMSPEC_PLUGIN_H
#define MEMSPEC_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEMSPEC_PLUGIN_ABI_VERSION 1u   /* memspec_plugin (v1) */
#define MEMSPEC_PLUGIN_ABI_VERSION_2 2u /* memspec_plugin2 (v2) */

/* Status codes; the loader raises the named memspec.spec.errors class. */
typedef enum memspec_status {
    MEMSPEC_OK = 0,
    MEMSPEC_ERR_INVALID_REQUEST = 1,    /* InvalidRequest: size <= 0, bad alignment, not a handle */
    MEMSPEC_ERR_INVALID_RANGE = 2,      /* InvalidRange: misaligned/outside/already committed range */
    MEMSPEC_ERR_OUT_OF_MEMORY = 3,      /* OutOfMemory: no physical capacity for the request */
    MEMSPEC_ERR_UNSUPPORTED = 4,        /* Unsupported: the call is explicitly not provided */
    MEMSPEC_ERR_FOREIGN_ALLOCATION = 5, /* ForeignAllocation: made by another instance */
    MEMSPEC_ERR_DOUBLE_FREE = 6,        /* DoubleFree: already freed/released */
    MEMSPEC_ERR_STALE_HANDLE = 7,       /* StaleHandle: identity not live (e.g. address reused) */
    MEMSPEC_ERR_READ_ONLY = 8           /* ReadOnlyViolation */
} memspec_status;

/* ==========================================================================
 * ABI version 1 (and what ABI 2 shares with it)
 * ========================================================================== */

typedef struct memspec_handle {
    uint64_t owner;       /* the instance that made it (nonzero, plugin-chosen) */
    uint64_t generation;  /* 1, 2, ... per instance; never reused */
    uint64_t address;     /* device address (allocations, reservations); 0 for physical handles */
    uint64_t size;        /* the size asked for */
    uint64_t footprint;   /* allocations: physical bytes taken (>= size); otherwise 0 */
} memspec_handle;

typedef struct memspec_plugin {
    uint32_t abi_version;  /* MEMSPEC_PLUGIN_ABI_VERSION */
    const char *name;      /* short name, e.g. "example-arena" */

    /* ---- lifetime ---------------------------------------------------- */
    /* A new instance.  share_with == NULL: on a new device of `capacity`
     * bytes (0: the plugin's default).  share_with != NULL: a second,
     * independent instance on share_with's device (same physical memory;
     * its handles are foreign to share_with).  NULL on failure. */
    void *(*create)(uint64_t capacity, void *share_with);
    void (*destroy)(void *self);              /* twins are destroyed before their device's first instance */
    uint64_t (*capacity)(void *self);         /* physical bytes of the device */
    /* Optional (NULL: absent): physical bytes the device holds now, computed
     * from the device's own free structures, not from a counter of calls. */
    uint64_t (*physical_bytes)(void *self);
    /* Optional: message for this instance's last failing call (or NULL). */
    const char *(*last_error)(void *self);
    /* Optional (NULL: absent): the host memory the device's addresses live in.
     * When set, [*base, *base + *size) must stay readable and writable by the
     * host for the instance's lifetime; the loader then gives the target an
     * execution provider (synchronous host copies, bounds-checked against this
     * range) so the suite's data-integrity checks run.  When absent they are N/A. */
    void (*memory)(void *self, uint64_t *base, uint64_t *size);

    /* ---- DeviceAllocator (required) ------------------------------------ */
    /* Take footprint >= size physical bytes now; address aligned to `alignment`
     * (a power of two).  size <= 0 -> INVALID_REQUEST; no room -> OUT_OF_MEMORY. */
    int32_t (*allocate)(void *self, int64_t size, uint64_t alignment, memspec_handle *out);
    /* Free an allocation this instance made; *freed = its footprint.
     * FOREIGN_ALLOCATION, DOUBLE_FREE, STALE_HANDLE otherwise (nothing freed). */
    int32_t (*deallocate)(void *self, const memspec_handle *allocation, uint64_t *freed);

    /* ---- VirtualBacking (optional: all NULL, or all set) ----------------- */
    uint64_t (*vb_granularity)(void *self);
    int32_t (*vb_reserve)(void *self, int64_t size, uint64_t alignment, memspec_handle *out);
    /* [start, end) offsets, page aligned; *committed = end - start exactly. */
    int32_t (*vb_commit)(void *self, const memspec_handle *res, uint64_t start, uint64_t end, uint64_t *committed);
    int32_t (*vb_decommit)(void *self, const memspec_handle *res, uint64_t start, uint64_t end, uint64_t *released);
    int32_t (*vb_committed_bytes)(void *self, const memspec_handle *res, uint64_t *out);
    int32_t (*vb_release)(void *self, const memspec_handle *res, uint64_t *released);

    /* ---- SharedMapping (optional: all NULL, or all set) ------------------ */
    uint64_t (*sm_granularity)(void *self);
    int32_t (*sm_reserve)(void *self, int64_t size, uint64_t alignment, memspec_handle *out);
    int32_t (*sm_free_reservation)(void *self, const memspec_handle *res);
    int32_t (*sm_create)(void *self, int64_t size, memspec_handle *out);
    int32_t (*sm_map)(void *self, const memspec_handle *physical, const memspec_handle *res, uint64_t offset,
                      int32_t read_only, uint64_t *mapped);
    int32_t (*sm_unmap)(void *self, const memspec_handle *res, uint64_t offset, uint64_t size, uint64_t *unmapped);
    int32_t (*sm_copy_on_write)(void *self, const memspec_handle *res, uint64_t offset, uint64_t size,
                                uint64_t *committed);
    int32_t (*sm_mapping_count)(void *self, const memspec_handle *physical, uint64_t *count);
    int32_t (*sm_release)(void *self, const memspec_handle *physical, uint64_t *freed);
} memspec_plugin;

/* The exported symbol of an ABI-1 plugin. */
const memspec_plugin *memspec_plugin_v1(void);

/* ==========================================================================
 * ABI version 2
 * ========================================================================== */

/* A handle of ABI 2: memspec_handle and where the allocation's block starts. */
typedef struct memspec_handle2 {
    uint64_t owner;       /* the instance that made it (nonzero, plugin-chosen) */
    uint64_t generation;  /* 1, 2, ... per instance; never reused */
    uint64_t address;     /* device address (allocations, reservations); 0 for physical handles */
    uint64_t size;        /* the size asked for */
    uint64_t footprint;   /* allocations: physical bytes taken (>= size), counted from `block`; otherwise 0 */
    uint64_t block;       /* allocations: where the footprint starts; 0: at `address` (no header in front) */
} memspec_handle2;

/* The most footprint a request may take (memspec.spec.api.FootprintBound):
 *   NONE     nothing declared (the excess over the request is measured);
 *   UNIT     size + header rounded up to the unit;
 *   POW2     the next power of two >= max(size + header, min_class);
 *   CLASSES  the smallest of classes[] >= size + header; past the last,
 *            size + header rounded up to the unit;
 * with next_class one class more (good fit: TLSF and the like); then, for an
 * alignment above the geometry's alignment, plus alignment - unit; then
 * rounded up to the unit. */
typedef enum memspec_bound_kind {
    MEMSPEC_BOUND_NONE = 0,
    MEMSPEC_BOUND_UNIT = 1,
    MEMSPEC_BOUND_POW2 = 2,
    MEMSPEC_BOUND_CLASSES = 3
} memspec_bound_kind;

/* overhead: not declared (the probe's excess over the live footprints is measured) */
#define MEMSPEC_OVERHEAD_UNDECLARED UINT64_MAX
/* the most classes a geometry may list */
#define MEMSPEC_MAX_CLASSES 4096u

/* How the allocator packs memory (memspec.spec.api.AllocatorGeometry).  The
 * loader fills the defaults (unit 1, alignment 1, bound NONE, header 0,
 * min_class 0, no classes, next_class 0, overhead UNDECLARED, max_alignment 0) and calls
 * `geometry`; the plugin overwrites what it declares.  Everything is checked
 * (a bad value refuses the plugin with a one-line error naming the field). */
typedef struct memspec_geometry {
    uint64_t unit;             /* allocation unit (granule), >= 1 */
    uint64_t alignment;        /* every address is aligned to this (a power of two) */
    uint32_t bound;            /* memspec_bound_kind */
    uint32_t next_class;       /* 0 or 1 */
    uint64_t header;           /* in-band bytes the bound adds to the request */
    uint64_t min_class;        /* POW2: the smallest class */
    const uint64_t *classes;   /* CLASSES: ascending, positive; read by the loader right after the call */
    uint64_t nclasses;         /* <= MEMSPEC_MAX_CLASSES */
    uint64_t overhead;         /* bytes of the capacity kept for itself, or MEMSPEC_OVERHEAD_UNDECLARED */
    /* the largest alignment allocate honours (a power of two >= alignment); a request for more may be refused
     * with INVALID_REQUEST.  0: no limit declared (every power-of-two alignment must be honoured).  Added
     * at the end of the struct: the loader owns it and fills 0, so a plugin built before it is unchanged. */
    uint64_t max_alignment;
} memspec_geometry;

/* flags */
#define MEMSPEC_HOST_POINTERS 1u  /* addresses are host pointers; the EP reaches live allocations only */

typedef struct memspec_plugin2 {
    uint32_t abi_version;  /* MEMSPEC_PLUGIN_ABI_VERSION_2 */
    const char *name;      /* short name, e.g. "example-arena" */

    /* lifetime, as in memspec_plugin (v1) */
    void *(*create)(uint64_t capacity, void *share_with);
    void (*destroy)(void *self);
    uint64_t (*capacity)(void *self);
    uint64_t (*physical_bytes)(void *self);
    const char *(*last_error)(void *self);
    void (*memory)(void *self, uint64_t *base, uint64_t *size);

    /* DeviceAllocator (required): the allocate contract above */
    int32_t (*allocate)(void *self, int64_t size, uint64_t alignment, memspec_handle2 *out);
    int32_t (*deallocate)(void *self, const memspec_handle2 *allocation, uint64_t *freed);

    /* VirtualBacking (optional: all NULL, or all set), as in v1 */
    uint64_t (*vb_granularity)(void *self);
    int32_t (*vb_reserve)(void *self, int64_t size, uint64_t alignment, memspec_handle2 *out);
    int32_t (*vb_commit)(void *self, const memspec_handle2 *res, uint64_t start, uint64_t end, uint64_t *committed);
    int32_t (*vb_decommit)(void *self, const memspec_handle2 *res, uint64_t start, uint64_t end, uint64_t *released);
    int32_t (*vb_committed_bytes)(void *self, const memspec_handle2 *res, uint64_t *out);
    int32_t (*vb_release)(void *self, const memspec_handle2 *res, uint64_t *released);

    /* SharedMapping (optional: all NULL, or all set), as in v1 */
    uint64_t (*sm_granularity)(void *self);
    int32_t (*sm_reserve)(void *self, int64_t size, uint64_t alignment, memspec_handle2 *out);
    int32_t (*sm_free_reservation)(void *self, const memspec_handle2 *res);
    int32_t (*sm_create)(void *self, int64_t size, memspec_handle2 *out);
    int32_t (*sm_map)(void *self, const memspec_handle2 *physical, const memspec_handle2 *res, uint64_t offset,
                      int32_t read_only, uint64_t *mapped);
    int32_t (*sm_unmap)(void *self, const memspec_handle2 *res, uint64_t offset, uint64_t size, uint64_t *unmapped);
    int32_t (*sm_copy_on_write)(void *self, const memspec_handle2 *res, uint64_t offset, uint64_t size,
                                uint64_t *committed);
    int32_t (*sm_mapping_count)(void *self, const memspec_handle2 *physical, uint64_t *count);
    int32_t (*sm_release)(void *self, const memspec_handle2 *physical, uint64_t *freed);

    /* ---- new in ABI 2 ---------------------------------------------------- */
    /* Optional (NULL: nothing declared): fill what the allocator declares. */
    void (*geometry)(void *self, memspec_geometry *out);
    uint64_t flags;        /* MEMSPEC_HOST_POINTERS, or 0 */
} memspec_plugin2;

/* The exported symbol of an ABI-2 plugin (the loader tries it first). */
const memspec_plugin2 *memspec_plugin_v2(void);

#ifdef __cplusplus
}
#endif

#endif /* MEMSPEC_PLUGIN_H */
