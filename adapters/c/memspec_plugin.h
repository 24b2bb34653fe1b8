/*
 * memspec_plugin.h -- the C ABI of memspec allocator plugins (ABI version 1).
 *
 * A plugin is a shared library exporting one function,
 *
 *     const memspec_plugin *memspec_plugin_v1(void);
 *
 * that returns a table of entry points.  `memspec conform c:path/to/lib.so`
 * loads it (memspec.adapters.c_plugin) and runs the conformance suite on it
 * as a seed-000 DeviceMemoryMechanism:
 *
 *   - DeviceAllocator (required): allocate / deallocate;
 *   - VirtualBacking (optional): vb_* -- all set, or all NULL (absent);
 *   - SharedMapping (optional): sm_* -- all set, or all NULL (absent).
 *
 * Seed 000: "when a capability is unsupported, return an explicit absence or
 * error rather than a successful no-op" -- leave the pointers NULL; the loader
 * then answers None for the capability.
 *
 * Handles.  Every object the plugin hands out is described by a
 * memspec_handle.  `owner` names the plugin instance that made it (any
 * nonzero value the plugin chooses, e.g. its address) and `generation`
 * counts that instance's handles from 1, never reused.  The loader passes the
 * very fields back on every later call; the plugin decides from them whether
 * the handle is foreign (owner differs), freed (generation no longer live)
 * or stale, whatever the address -- a recycled address must not make a stale
 * handle valid.
 *
 * Errors.  Every call returns a memspec_status; MEMSPEC_OK and the outputs
 * written, or an error and nothing changed ("on error nothing stays
 * committed").  Each status is one class of memspec.spec.errors (below).
 * `last_error` (optional) gives a message for the instance's last failure.
 *
 * Threads.  The loader calls one instance from one thread at a time.
 * Memory.  Addresses are device addresses: the loader dereferences them only
 * inside the range `memory` declares (and only when it is declared).
 */
#ifndef MEMSPEC_PLUGIN_H
#define MEMSPEC_PLUGIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEMSPEC_PLUGIN_ABI_VERSION 1u

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

/* The one exported symbol. */
const memspec_plugin *memspec_plugin_v1(void);

#ifdef __cplusplus
}
#endif

#endif /* MEMSPEC_PLUGIN_H */
