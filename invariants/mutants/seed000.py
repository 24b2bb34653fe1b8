"""Planted bugs for the invariants of seed 000 (S1-S15): one rule broken each.

Each mutant subclasses or wraps a reference class and changes exactly one
behaviour.  Mechanism bugs come as a ``factory`` (a reference target whose
mechanism object has the broken class); role bugs (governor, manager,
binding, EP queue, owning handles, holders) come as ``patch_system``, which
breaks the system the harness wires around a healthy reference target.

The harness must catch every one, blamed on the invariant named here
(``memspec mutants``).
"""

from __future__ import annotations

from typing import Any, Callable

from memspec.invariants.mutants import Mutant
from memspec.spec.api import TargetInstance
from memspec.spec.errors import DoubleFree, InvalidRange, StaleHandle


def _reference(kind: str = "reference") -> Callable[..., TargetInstance]:
    def make(capacity: int | None = None) -> TargetInstance:
        from memspec.reference import targets

        fac = {"reference": targets.reference, "reference-eager": targets.reference_eager,
               "reference-vmm": targets.reference_vmm}[kind]
        return fac(capacity) if capacity is not None else fac()

    return make


def _mechanism_mutant(kind: str, attr: str, cls_factory: Callable[[type], type]) -> Callable[..., TargetInstance]:
    """A reference target whose mechanism's ``attr`` object (``_alloc``,
    ``_vb``, ``_sm``) is switched to a broken subclass of its class.  The
    foreign twin (``extras['make_foreign']``) stays healthy."""

    def factory(capacity: int | None = None) -> TargetInstance:
        inst = _reference(kind)(capacity)
        obj = getattr(inst.mechanism, attr)
        obj.__class__ = cls_factory(type(obj))
        return inst

    return factory


# --------------------------------------------------------------------------
# Mechanism level
# --------------------------------------------------------------------------

def _noop_commit(base: type) -> type:
    class NoopCommitBacking(base):
        """S5: ``commit_range`` validates, then reports success without mapping anything."""

        def commit_range(self, allocation, start, end):
            s = self._s
            with s.lock:
                rec = s.lookup(allocation)
                idx = s.pages_of(rec, start, end)
                for i in idx:
                    if i in rec.private or i in rec.shared:
                        raise InvalidRange(f"page {i} already backed")
                return len(idx) * s.page  # "Ok(())" -- nothing was installed

    return NoopCommitBacking


def _foreign_free(base: type) -> type:
    class AcceptsForeignFree(base):
        """S1: ``deallocate`` accepts an allocation another allocator made
        (answers its footprint as if it had freed it)."""

        def deallocate(self, allocation):
            ident = getattr(allocation, "identity", None)
            if ident is not None and getattr(ident, "creator", None) != self.creator:
                return allocation.footprint
            return super().deallocate(allocation)

    return AcceptsForeignFree


def _identity_by_address(base: type) -> type:
    class IdentityByAddress(base):
        """S14: a handle is recognised by its address: a stale handle whose
        address was reused frees the newer allocation living there."""

        def _lookup(self, allocation):
            try:
                return super()._lookup(allocation)
            except (DoubleFree, StaleHandle):
                for rec in self._live.values():
                    if rec[0].address == allocation.address:
                        return rec
                raise

    return IdentityByAddress


def _shared_freed_while_mapped(base: type) -> type:
    class FreesWhileMapped(base):
        """S13: releasing a physical handle frees its pages at once, even
        while mappings of it remain."""

        def release(self, handle):
            s = self._s
            with s.lock:
                ph = self._handle(handle, releasing=True)
                ph.released = True
                if ph.mappings and not ph.freed:
                    s.dev.release_pages(ph.pages)
                    ph.freed = True
                    return len(ph.pages) * s.page
                return s.maybe_free(ph)

    return FreesWhileMapped


MECHANISM_MUTANTS = [
    Mutant("noop-commit", "S5", "commit_range returns success without mapping",
           _mechanism_mutant("reference-vmm", "_vb", _noop_commit)),
    Mutant("foreign-free", "S1", "deallocate accepts another allocator's allocation",
           _mechanism_mutant("reference-eager", "_alloc", _foreign_free)),
    Mutant("identity-by-address", "S14", "a stale handle's reused address frees the new allocation (identity reused with the address)",
           _mechanism_mutant("reference-eager", "_alloc", _identity_by_address)),
    Mutant("shared-freed-while-mapped", "S13", "a shared physical page is freed while still mapped",
           _mechanism_mutant("reference", "_sm", _shared_freed_while_mapped)),
]

MUTANTS: list[Mutant] = list(MECHANISM_MUTANTS)
