"""The C ABI (issue 31): versions 1 and 2 of the loader, what it validates
(geometry, memory range, block, flags, text), the host EP's reach, and the
kit's handle table (memspec_kit.h: stale, double and foreign frees)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from memspec.adapters import c_plugin
from memspec.adapters.c_plugin import Library, PluginError
from memspec.invariants import runner
from memspec.invariants.discovery import resolve
from memspec.spec.api import AllocationRequest, DeviceAllocation, Identity, MiB
from memspec.spec.errors import DeviceFault, DoubleFree, ForeignAllocation, OutOfMemory, StaleHandle

ROOT = Path(__file__).resolve().parent.parent
C_DIR = ROOT / "adapters" / "c"


def _cc() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc) on this machine")
    return cc


def _build(out: Path, name: str, source: Path, *flags: str) -> Path:
    lib = out / f"lib{name}.so"
    p = subprocess.run([_cc(), "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{C_DIR}", f"-I{C_DIR / 'zoo'}",
                        *flags, "-o", str(lib), str(source), "-ldl"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cabi")
    return {
        "v2": _build(out, "arena_v2", C_DIR / "example_arena.c"),
        "v1": _build(out, "arena_v1", C_DIR / "example_arena.c", "-DMEMSPEC_EXAMPLE_ABI1"),
        "classes": _build(out, "classes", C_DIR / "example_classes.c"),
        "classes_broken": _build(out, "classes_broken", C_DIR / "example_classes.c",
                                 "-DMEMSPEC_BROKEN_HEADER_NOT_COUNTED"),
        "glibc": _build(out, "zoo_glibc", C_DIR / "zoo" / "zoo_glibc.c"),
    }


# --------------------------------------------------------------------------
# v1 and v2
# --------------------------------------------------------------------------

def test_v1_plugin_still_loads_and_runs(libs):
    lib = Library.load(str(libs["v1"]))
    assert lib.abi == 1 and lib.Handle is c_plugin.Handle and not lib.has_geometry
    inst = resolve(f"c:{libs['v1']}").factory(capacity=8 * MiB)
    try:
        assert inst.geometry is None
        a = inst.mechanism.allocator()
        x = a.allocate(AllocationRequest(1000))
        assert (x.footprint, x.block) == (1024, None) and inst.physical_bytes() == 1024
        assert a.deallocate(x) == 1024
    finally:
        inst.close()
    results = runner.conform(f"c:{libs['v1']}", "mechanism", examples=10, steps=15, out_dir=None)
    assert results[0].ok and not results[0].errors, [(f.invariant, f.reason) for f in results[0].failures]


def test_v2_example_declares_what_it_does(libs):
    lib = Library.load(str(libs["v2"]))
    assert lib.abi == 2 and lib.Handle is c_plugin.Handle2 and lib.has_geometry and lib.flags == 0
    inst = resolve(f"c:{libs['v2']}").factory(capacity=8 * MiB)
    try:
        g = inst.geometry
        assert (g.unit, g.alignment, g.bound.rounding, g.overhead) == (256, 256, "unit", 0)
        a = inst.mechanism.allocator()
        for size, align in ((1, 1), (1000, 256), (5000, 4096), (3 * 4096 + 1, 1 << 16)):
            x = a.allocate(AllocationRequest(size, align))
            # what it declares is what it does: the request rounded to 256, 256-aligned (and the request's)
            assert x.footprint == -(-size // 256) * 256 and x.address % max(align, 256) == 0 and x.block is None
            a.deallocate(x)
    finally:
        inst.close()


def test_block_travels_both_ways(libs):
    inst = resolve(f"c:{libs['classes']}").factory(capacity=8 * MiB)
    try:
        a = inst.mechanism.allocator()
        x = a.allocate(AllocationRequest(100))
        assert x.block == x.address - 16 and x.footprint == 128
        g = inst.geometry
        assert g.bound.rounding == "classes" and g.bound.header == 16 and g.bound.classes[0] == 32
        assert g.overhead is None
        # the handle goes back with its block: a copy with another block is not that allocation
        forged = DeviceAllocation(x.address, x.size, x.footprint, x.identity, x.device, block=x.address)
        with pytest.raises(StaleHandle):
            a.deallocate(forged)
        assert a.deallocate(x) == 128
    finally:
        inst.close()


def test_header_not_counted_is_caught(libs):
    # the planted bug: the class is chosen for the request alone, so the requested bytes
    # run past the block (into the next block's header): S8's block clause
    results = runner.conform(f"c:{libs['classes_broken']}", "mechanism", examples=30, steps=20, out_dir=None)
    assert not results[0].errors, results[0].errors
    fails = [(f.invariant, f.reason) for f in results[0].failures]
    assert fails and fails[0][0] == "S8" and "block" in fails[0][1], fails


def test_classes_example_passes(libs):
    results = runner.conform(f"c:{libs['classes']}", "mechanism", examples=20, steps=20, out_dir=None)
    r = results[0]
    assert r.ok and not r.errors, [(f.invariant, f.reason) for f in r.failures]


# --------------------------------------------------------------------------
# What the loader validates
# --------------------------------------------------------------------------

BAD_PLUGIN = r'''
#include <stdint.h>
#include <sys/mman.h>
#include "memspec_kit.h"
__attribute__((unused)) static uint64_t classes[3] = {64, 32, 128};
static void *o(uint64_t c, char *e, size_t n) { (void)e; (void)n; static uint64_t cap; cap = c ? c : (4u << 20); return &cap; }
static void cl(void *d) { (void)d; }
static uint64_t cp(void *d) { return *(uint64_t *)d; }
static int32_t al(void *d, uint64_t s, uint64_t a, memspec_kit_block *b, char *e, size_t n) {
    (void)d; (void)e; (void)n; void *p = NULL;
    if (posix_memalign(&p, a < 16 ? 16 : a, s)) return MEMSPEC_ERR_OUT_OF_MEMORY;
    b->address = (uint64_t)(uintptr_t)p; b->footprint = s; b->cookie = p;
#if BAD == 20
    b->block = b->address + 8;   /* a block after the address */
#endif
    return MEMSPEC_OK;
}
static void fr(void *d, const memspec_kit_block *b) { (void)d; free(b->cookie); }
__attribute__((unused)) static void mem(void *d, uint64_t *base, uint64_t *size) {
    (void)d;
#if BAD == 10
    *base = 0; *size = 4096;
#elif BAD == 11
    *base = UINT64_MAX - 10; *size = 4096;
#elif BAD == 12
    *base = 0x10000; *size = 1u << 20;   /* nothing is mapped at 64 KiB */
#elif BAD == 13
    static void *ro; if (!ro) ro = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    *base = (uint64_t)(uintptr_t)ro; *size = 8192;
#else
    static char buf[4096]; *base = (uint64_t)(uintptr_t)buf; *size = sizeof buf;
#endif
}
static void geo(void *d, memspec_geometry *g) {
    (void)d;
#if BAD == 1
    g->unit = 0;
#elif BAD == 2
    g->alignment = 48;
#elif BAD == 3
    g->bound = 7;
#elif BAD == 4
    g->bound = MEMSPEC_BOUND_CLASSES; g->classes = classes; g->nclasses = 3;
#elif BAD == 5
    g->bound = MEMSPEC_BOUND_CLASSES; g->classes = (const uint64_t *)(uintptr_t)0x10; g->nclasses = 4;
#elif BAD == 6
    g->bound = MEMSPEC_BOUND_CLASSES; g->nclasses = 100000; g->classes = classes;
#elif BAD == 7
    g->overhead = (uint64_t)1 << 63;
#elif BAD == 8
    g->header = 64;
#elif BAD == 9
    g->next_class = 2;
#elif BAD == 40
    g->alignment = 256; g->max_alignment = 128;   /* below the alignment every address has */
#elif BAD == 41
    g->max_alignment = 3000;                       /* not a power of two */
#elif BAD == 42
    g->max_alignment = 4096;                       /* good: declared */
#endif
}
static const memspec_kit_ops OPS = {
    .name = "bad\x01\nplugin-" "0123456789012345678901234567890123456789012345678901234567890123456789",
    .open = o, .close = cl, .capacity = cp, .alloc = al, .free = fr, .geometry = geo,
#if BAD >= 10 && BAD < 20
    .memory = mem,
#endif
#if BAD == 30
    .flags = 1u << 7,
#endif
};
MEMSPEC_KIT_PLUGIN(OPS)
'''


@pytest.fixture(scope="module")
def bad_source(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    src = d / "bad.c"
    src.write_text(BAD_PLUGIN)
    return d, src


@pytest.mark.parametrize("bad, field", [
    (1, "geometry.unit"), (2, "geometry.alignment"), (3, "geometry.bound"), (4, "geometry.classes"),
    (5, "geometry.classes"), (6, "geometry.nclasses"), (7, "geometry.overhead"), (8, "geometry.bound"),
    (9, "geometry.next_class"), (40, "geometry.max_alignment"), (41, "geometry.max_alignment"),
])
def test_a_bad_geometry_is_refused_naming_the_field(bad_source, bad, field):
    d, src = bad_source
    lib = _build(d, f"bad{bad}", src, f"-DBAD={bad}")
    make = c_plugin.factory(str(lib))
    with pytest.raises(PluginError, match=field.replace(".", r"\.")) as e:
        make()
    assert "\n" not in str(e.value)
    # under the suite: the target could not be built, one line naming the field
    results = runner.conform(f"c:{lib}", "mechanism", examples=2, steps=3, out_dir=None)
    errors = " ".join(results[0].errors)
    assert field in errors and not results[0].failures, results[0].errors


def test_max_alignment_travels_and_its_absence_is_no_limit(bad_source, libs):
    """ABI 2's ``max_alignment`` (appended to ``memspec_geometry``): declared, it reaches the spec's
    geometry (a request above it may be refused); a plugin that does not set it keeps 0 = no limit."""
    d, src = bad_source
    inst = c_plugin.factory(str(_build(d, "bad42", src, "-DBAD=42")))()
    try:
        assert inst.geometry.max_alignment == 4096
    finally:
        inst.close()
    inst = resolve(f"c:{libs['classes']}").factory(capacity=8 << 20)   # declares a geometry, no max_alignment
    try:
        assert inst.geometry is not None and inst.geometry.max_alignment is None
    finally:
        inst.close()


@pytest.mark.parametrize("bad, why", [(10, "NULL"), (11, "overflows"), (12, "not mapped"), (13, "not read-write")])
def test_a_bad_memory_range_is_refused(bad_source, bad, why):
    d, src = bad_source
    lib = _build(d, f"bad{bad}", src, f"-DBAD={bad}")
    with pytest.raises(PluginError, match=why):
        c_plugin.factory(str(lib))()


def test_a_good_memory_range_and_sanitized_name(bad_source):
    d, src = bad_source
    lib = _build(d, "bad14", src, "-DBAD=14")
    inst = c_plugin.factory(str(lib))()
    try:
        name = Library.load(str(lib)).name
        assert name.startswith("bad  plugin-") and len(name) <= 64 and name.isprintable()
        assert isinstance(inst.ep.reach, c_plugin.Region)
    finally:
        inst.close()


def test_a_block_that_does_not_hold_the_allocation_is_judged_by_the_spec(bad_source):
    # the loader passes block on (it only keeps its EP inside the bytes the library claims);
    # the spec's S8 block clause judges it
    d, src = bad_source
    lib = _build(d, "bad20", src, "-DBAD=20")
    inst = c_plugin.factory(str(lib))()
    try:
        x = inst.mechanism.allocator().allocate(AllocationRequest(100))
        assert x.block == x.address + 8
    finally:
        inst.close()
    results = runner.conform(f"c:{lib}", "mechanism", examples=10, steps=10, out_dir=None)
    assert not results[0].errors, results[0].errors
    fails = [(f.invariant, f.reason) for f in results[0].failures]
    assert fails and fails[0][0] == "S8" and "block" in fails[0][1], fails


def test_unknown_flags_are_refused(bad_source):
    d, src = bad_source
    lib = _build(d, "bad30", src, "-DBAD=30")
    with pytest.raises(LookupError, match="flags"):
        c_plugin.factory(str(lib))


def test_peek_never_faults():
    assert c_plugin.peek(0x10, 8) is None and c_plugin.peek(0, 1) is None
    buf = ctypes.create_string_buffer(b"memspec", 8)
    assert c_plugin.peek(ctypes.addressof(buf), 7) == b"memspec"
    assert c_plugin.text(ctypes.addressof(buf)) == "memspec" and c_plugin.text(0x10) == ""


# --------------------------------------------------------------------------
# The host EP over live allocations (MEMSPEC_HOST_POINTERS)
# --------------------------------------------------------------------------

def test_host_ep_reaches_only_live_allocations(libs):
    inst = resolve(f"c:{libs['glibc']}").factory(capacity=4 * MiB)
    try:
        assert isinstance(inst.ep.reach, c_plugin.LiveAllocations)
        a = inst.mechanism.allocator()
        x = a.allocate(AllocationRequest(100))
        inst.ep.write(0, x.address, b"x" * 100)
        assert inst.ep.read(0, x.address, 100) == b"x" * 100
        end = x.block + x.footprint
        inst.ep.read(0, end - 1, 1)                      # the last usable byte is the allocation's
        for addr, n in ((end, 1), (x.address - 1, 2), (x.address + 1 << 20, 4)):
            with pytest.raises(DeviceFault):
                inst.ep.read(0, addr, n)
        # a twin's allocations are on the same device: reachable too, until freed
        twin = inst.make_foreign().allocator()
        y = twin.allocate(AllocationRequest(4096))
        inst.ep.write(0, y.address, b"y" * 4096)
        twin.deallocate(y)
        a.deallocate(x)
        for gone in (x, y):
            with pytest.raises(DeviceFault):
                inst.ep.read(0, gone.address, 1)
    finally:
        inst.close()


# --------------------------------------------------------------------------
# The kit: handle table and budget
# --------------------------------------------------------------------------

def test_kit_refuses_foreign_double_and_stale(libs):
    inst = resolve(f"c:{libs['classes']}").factory(capacity=8 * MiB)
    try:
        a = inst.mechanism.allocator()
        twin = inst.make_foreign().allocator()
        x = a.allocate(AllocationRequest(100))
        with pytest.raises(ForeignAllocation):
            twin.deallocate(x)
        assert a.deallocate(x) == 128
        with pytest.raises(DoubleFree):
            a.deallocate(x)
        # the address is recycled (the class's free list gives the block back): the old handle stays dead
        y = a.allocate(AllocationRequest(100))
        assert y.address == x.address and y.identity != x.identity
        with pytest.raises(DoubleFree):
            a.deallocate(x)
        never = DeviceAllocation(y.address, y.size, y.footprint, Identity(y.identity.creator, 10_000), y.device,
                                 block=y.block)
        with pytest.raises(StaleHandle):
            a.deallocate(never)
        other_fields = DeviceAllocation(y.address + 16, y.size, y.footprint, y.identity, y.device, block=y.block)
        with pytest.raises(StaleHandle):
            a.deallocate(other_fields)
        assert inst.physical_bytes() >= y.footprint
        assert a.deallocate(y) == 128                    # y itself was never disturbed
    finally:
        inst.close()


def test_kit_budget_is_the_capacity(libs):
    inst = resolve(f"c:{libs['glibc']}").factory(capacity=1 * MiB)
    try:
        a = inst.mechanism.allocator()
        x = a.allocate(AllocationRequest(600 * 1024))
        with pytest.raises(OutOfMemory, match="full"):
            a.allocate(AllocationRequest(600 * 1024))
        with pytest.raises(OutOfMemory):
            a.allocate(AllocationRequest(2 * MiB))
        a.deallocate(x)
        a.deallocate(a.allocate(AllocationRequest(600 * 1024)))
    finally:
        inst.close()
