/*
 * mimalloc 2.0.9 (Debian 12 libmimalloc2.0 2.0.9+ds-2): mi_heap_malloc_aligned
 * on a heap made with mi_heap_new_in_arena returns a pointer that is not
 * aligned as asked.  Standalone (no memspec):
 *
 *   cc -O2 -o /tmp/mi_align docs/findings/mimalloc_aligned_in_arena_heap.c -ldl && /tmp/mi_align
 *
 * Exit 1 and "REPRODUCED" while the defect is present; 0 otherwise.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

typedef int mi_arena_id_t;
typedef struct mi_heap_s mi_heap_t;

int main(void) {
    void *lib = dlopen("libmimalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("libmimalloc.so.2 not installed: %s\n", dlerror()); return 2; }
    bool (*manage)(void *, size_t, bool, bool, bool, int, bool, mi_arena_id_t *) = dlsym(lib, "mi_manage_os_memory_ex");
    mi_heap_t *(*heap_new_in_arena)(mi_arena_id_t) = dlsym(lib, "mi_heap_new_in_arena");
    mi_heap_t *(*heap_new)(void) = dlsym(lib, "mi_heap_new");
    void *(*heap_malloc_aligned)(mi_heap_t *, size_t, size_t) = dlsym(lib, "mi_heap_malloc_aligned");
    int (*version)(void) = dlsym(lib, "mi_version");
    const size_t seg = 32u << 20, size = 256u << 20;
    uint8_t *raw = mmap(NULL, size + seg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uint8_t *base = (uint8_t *)(((uintptr_t)raw + seg - 1) / seg * seg);
    mi_arena_id_t id;
    if (!manage(base, size, true, false, true, -1, true, &id)) { printf("mi_manage_os_memory_ex failed\n"); return 2; }
    printf("mimalloc %d\n", version());
    int bad = 0;
    const char *kinds[] = {"mi_heap_new_in_arena (exclusive arena)", "mi_heap_new (default arenas)"};
    for (int k = 0; k < 2; k++) {
        mi_heap_t *h = k == 0 ? heap_new_in_arena(id) : heap_new();
        for (size_t align = 16; align <= 4096; align *= 2) {
            for (size_t sz = align; sz <= 4 * align; sz += align) {
                void *p = heap_malloc_aligned(h, sz, align);
                if ((uintptr_t)p % align) {
                    if (bad++ < 8) printf("%s: mi_heap_malloc_aligned(%zu, %zu) = %p, misaligned by %zu\n",
                                          kinds[k], sz, align, p, (size_t)((uintptr_t)p % align));
                }
            }
        }
    }
    if (bad) { printf("REPRODUCED: %d misaligned results\n", bad); return 1; }
    printf("did not reproduce\n");
    return 0;
}
