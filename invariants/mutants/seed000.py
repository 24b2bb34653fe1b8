"""Planted bugs for the invariants of seed 000 (S1-S15): one rule broken each.

Each mutant subclasses or wraps a reference class and changes exactly one
behaviour.  Every mutant is a plain target factory, planted through the
public target contract (``memspec conform memspec.invariants.mutants.seed000:NAME``
works as well as ``mutant:NAME``): mechanism bugs are a reference target
whose mechanism object has the broken class; role bugs (governor, manager,
binding, EP queue, owning handles, holders) are a reference target that
brings the broken role itself (``TargetInstance.roles``, a
:class:`~memspec.spec.api.SystemRoles`), the reference filling the rest.

The harness must catch every one, blamed on the invariant named here
(``memspec mutants``).
"""

from __future__ import annotations

from typing import Any, Callable

from memspec.invariants.mutants import Mutant
from memspec.spec.api import SystemRoles, TargetInstance
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
    foreign twin (``make_foreign``) stays healthy."""

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

# --------------------------------------------------------------------------
# System level: the roles wired around a healthy reference mechanism
# --------------------------------------------------------------------------

def _commit_before_charge(b: Any) -> Any:
    """S2: the binding installs the pages first and asks the Governor
    afterwards; a refusal is swallowed (the pages stay, uncharged)."""
    from memspec.spec.errors import GrantDenied


    def commit(reservation, start, end):
        res = b._own(reservation)
        page = res.backing.granularity()
        n = res.backing.commit_range(res.allocation, start, end)      # physical commit first
        try:
            grant = b.governor.reserve(res.holder, end - start)       # ...then the charge
            res.leases.append(b.governor.commit(grant, n))
        except GrantDenied:
            pass                                                      # "charge it later"
        with res.lock:
            res.pages.update(range(start, end, page))
        return n

    b.commit = commit
    return b


def _stale_capabilities(mgr: Any) -> Any:
    """S3: the manager answers capability queries from a snapshot taken at
    the first query, even after another mechanism was selected."""
    orig = mgr.capabilities
    snap: dict = {}

    def capabilities(device):
        if device not in snap:
            snap[device] = orig(device)
        return snap[device]

    mgr.capabilities = capabilities
    return mgr


def _release_before_fence(b: Any) -> Any:
    """S4: dropping an owning allocation frees its memory at once; only the
    refund waits in the deferred-free queue for the fences (the memory is
    gone while queued work may still read it -- the "unmap before the fence"
    bug of a real VMM resource)."""
    import types

    orig = b.allocate

    def close(h):
        if h._r.closed:
            raise DoubleFree("handle already dropped")
        freed = h._allocator.deallocate(h.allocation)   # before the fence
        h._r.close(lambda: freed)                       # the queue only refunds

    def allocate(holder, size, **kw):
        h = orig(holder, size, **kw)
        h.close = types.MethodType(close, h)
        return h

    b.allocate = allocate
    return b


def _governor_evicts(weights: Any) -> Any:
    """S6: issuing a pressure ticket, the Governor unloads the cold weights
    itself instead of asking the holder (planted where the Governor can
    reach them: the weights holder, made with the binding and its Governor)."""
    gov = weights.binding.governor
    orig = gov.issue_ticket

    def issue_ticket(*a, **kw):
        for name, (_size, hot) in list(weights.weights().items()):
            if not hot:
                weights.unload(name)
        return orig(*a, **kw)

    gov.issue_ticket = issue_ticket
    return weights


def _drop_frees_synchronously(ep: Any) -> Any:
    """S7: dropping an owning handle runs its release on the caller's thread
    at once instead of enqueuing it."""

    def defer(fences, release):
        release()

    ep.defer = defer
    return ep


def _charge_at_plan(b: Any) -> Any:
    """S8: the binding charges the planned (requested) bytes, not the
    footprint the allocator actually took (seed 000: *act on the real
    allocated bytes; do not silently keep incorrect accounts*)."""
    gov = b.governor
    orig_commit = gov.commit
    orig_allocate = b.allocate
    inside = [False]

    def commit(grant, actual):
        return orig_commit(grant, grant.nbytes if inside[0] else actual)

    def allocate(holder, size, **kw):
        inside[0] = True
        try:
            return orig_allocate(holder, size, **kw)
        finally:
            inside[0] = False

    gov.commit = commit
    b.allocate = allocate
    return b


def _growth_keeps_partial_mapping(b: Any) -> Any:
    """S9: a KV growth that fails after committing part of its pages rolls
    back the grant but keeps the pages mapped."""
    from memspec.reference.manager import GrowthTxn

    class KeepsPieces(GrowthTxn):
        def rollback(self):
            self.pieces.clear()        # forget to decommit what step 4 installed
            super().rollback()

    orig = b.transaction

    def transaction(reservation, start, end):
        t = orig(reservation, start, end)
        t.__class__ = KeepsPieces
        return t

    b.transaction = transaction
    return b


def _destroy_pinned_context(mgr: Any) -> Any:
    """S10: the manager destroys a provider context although allocations
    (or queued releases) made in it are alive."""
    def destroy_context(context_id):
        with mgr._lock:
            mgr.context(context_id)
            del mgr._contexts[context_id]
            mgr._pins.pop(context_id, None)
            mgr.destroyed.add(context_id)

    mgr.destroy_context = destroy_context
    return mgr


def _cancel_leaks_grant(gov: Any) -> Any:
    """S11: cancelling a provisional grant takes it off the granted figure
    but never puts the bytes back into free."""
    def cancel(grant):
        with gov._lock:
            g = gov._take_grant(grant)
            del gov._grants[g.grant_id]
            gov._granted -= g.nbytes
            return g.nbytes

    gov.cancel = cancel
    return gov


def _moving_reservation(b: Any) -> Any:
    """S12: decommitting part of an owning reservation moves it: the handle
    comes back describing a base address one reservation further on."""
    from memspec.spec.api import VirtualAllocation

    orig = b.decommit

    def decommit(reservation, start, end):
        n = orig(reservation, start, end)
        va = reservation.allocation
        reservation.allocation = VirtualAllocation(va.address + va.size, va.size, va.identity, va.device)
        return n

    b.decommit = decommit
    return b


def _ticket_refunded_twice(gov: Any) -> Any:
    """S15: cancelling a ticket that is already cancelled returns its bytes again."""
    from memspec.spec.api import TicketState

    orig = gov.cancel_ticket
    returned: dict = {}

    def cancel_ticket(ticket):
        with gov._lock:
            t = gov._ticket(ticket)
            if t.state == TicketState.CANCELLED:
                n = returned.get(t.ticket_id, 0)
                gov._free += n
                gov._granted -= n
                return n
        n = orig(ticket)
        returned[ticket.ticket_id] = n
        return n

    gov.cancel_ticket = cancel_ticket
    return gov


def _with_role(kind: str, role: str, plant: Callable[[Any], Any]) -> Callable[..., TargetInstance]:
    """A reference target that brings one broken role through the contract:
    the reference role, made as the harness would, with ``plant`` applied."""

    def factory(capacity: int | None = None) -> TargetInstance:
        from memspec.reference.ep import ReferenceEP
        from memspec.reference.governor import ReferenceGovernor
        from memspec.reference.holders import ModelResidency
        from memspec.reference.manager import ReferenceManager

        inst = _reference(kind)(capacity)
        if role == "ep":
            inst.ep = plant(inst.ep if inst.ep is not None else ReferenceEP(inst.device))
            return inst
        makers = {
            "governor": lambda cap: plant(ReferenceGovernor(cap)),
            "manager": lambda: plant(ReferenceManager()),
            "binding": lambda mgr, device, ctx, auth: plant(mgr.bind(device, ctx, auth)),
            "weights": lambda binding: plant(ModelResidency(binding)),
        }
        inst.roles = SystemRoles(**{role: makers[role]})
        return inst

    factory.__name__ = plant.__name__.lstrip("_")
    return factory


def _system(name: str, invariant: str, description: str, role: str, plant: Callable[[Any], Any],
            kind: str = "reference") -> Mutant:
    return Mutant(name, invariant, description, _with_role(kind, role, plant), level="system")


SYSTEM_MUTANTS = [
    _system("commit-before-charge", "S2", "the binding commits pages before the charge and swallows a refusal",
            "binding", _commit_before_charge, "reference-vmm"),
    _system("stale-capabilities", "S3", "a cached capability snapshot after mechanism replacement", "manager",
            _stale_capabilities),
    _system("release-before-fence", "S4", "the deferred-free queue releases before the fence", "binding",
            _release_before_fence),
    _system("governor-evicts", "S6", "the governor evicts holder data itself", "weights", _governor_evicts),
    _system("drop-frees-synchronously", "S7", "a drop that frees synchronously", "ep", _drop_frees_synchronously),
    _system("charge-at-plan", "S8", "an allocation is charged its requested size, not its actual footprint",
            "binding", _charge_at_plan),
    _system("growth-keeps-partial-mapping", "S9", "a growth that keeps a partial mapping on failure", "binding",
            _growth_keeps_partial_mapping, "reference-vmm"),
    _system("destroy-pinned-context", "S10", "a context destroyed with live allocations", "manager",
            _destroy_pinned_context),
    _system("cancel-leaks-grant", "S11", "a cancelled grant never returns to free", "governor", _cancel_leaks_grant),
    _system("moving-reservation", "S12", "a decommit moves the reservation's base address", "binding",
            _moving_reservation, "reference-vmm"),
    _system("ticket-refunded-twice", "S15", "a ticket refunded twice", "governor", _ticket_refunded_twice),
]

MUTANTS: list[Mutant] = list(MECHANISM_MUTANTS) + SYSTEM_MUTANTS

#: every mutant as a plain ``module:attr`` target, e.g.
#: ``memspec conform memspec.invariants.mutants.seed000:cancel_leaks_grant``
TARGETS: dict[str, Callable[..., TargetInstance]] = {m.name.replace("-", "_"): m.factory for m in MUTANTS}
globals().update(TARGETS)
