"""Holders: the only roles that know what data means and choose victims.

Seed 000: *Only the holder knows what can be released: ModelResidency: two
cold weights can free 700 MB; KvPageStore: all pages are in use by in-flight
kernels, can free only 0.  ...  A holder may legitimately release 0 bytes.*

Both holders allocate only through a :class:`~.manager.ReferenceBinding`
(so every byte is granted and charged first) and release only through owning
handles (so every release waits for its fences on the EP queue).  On a
pressure ticket a holder releases what is safe *now* -- data not used by
in-flight work -- lets the EP queue run those releases (their fences are
done), and answers the bytes actually freed; the caller records the answer
with ``Governor.respond``.

:class:`KvPageStore` grows a request's KV by seed 000's transaction:

1. VirtualBacking.reserve(max) -- at :meth:`KvPageStore.open`, stable address;
2. the Holder computes the physical bytes needed for the next growth;
3. the Governor provides a provisional grant for the growth amount;
4. the EP/backing runs commit_range;
5. the Holder updates the KV view and logical state;
6. on success, commit the charge.

*If step 4 or 5 fails: roll back the provisional mapping; return the grant;
keep the old KV view and request state; do not expose a partially committed
new state.*  ``fail_at=4`` injects a commit failure after part of the range
was mapped (so the rollback has something to undo); ``fail_at=5`` fails the
view update after the whole range was mapped.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from memspec.spec.api import Fence, Lease, PhysicalHandle, ReserveRequest, Ticket
from memspec.spec.errors import InvalidRequest, OutOfMemory, Unsupported

from memspec.reference.common import check_size, is_int, round_up
from memspec.reference.handles import RefAllocation, RefReservation
from memspec.reference.manager import ReferenceBinding


class InjectedFailure(OutOfMemory):
    """A failure injected into the growth transaction at ``step`` (4 or 5)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"injected failure at step {step} of the KV growth transaction")
        self.step = step


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{what} must be a non-empty str, got {name!r}")
    return name


# --------------------------------------------------------------------------
# ModelResidency
# --------------------------------------------------------------------------

class ModelResidency:
    """Model weights, each hot (in use) or cold (evictable)."""

    def __init__(self, binding: ReferenceBinding, name: str = "weights") -> None:
        self.name = name
        self.binding = binding
        self._lock = threading.RLock()
        self._weights: dict[str, tuple[RefAllocation, bool]] = {}

    def load(self, weight: str, size: int, *, hot: bool) -> None:
        """Allocate a weight through the binding (charged to this holder)."""
        _check_name(weight, "weight")
        check_size(size)
        with self._lock:
            if weight in self._weights:
                raise InvalidRequest(f"weight {weight!r} is already loaded")
            self._weights[weight] = (self.binding.allocate(self.name, size), bool(hot))

    def _get(self, weight: str) -> tuple[RefAllocation, bool]:
        if weight not in self._weights:
            raise InvalidRequest(f"weight {weight!r} is not loaded")
        return self._weights[weight]

    def set_hot(self, weight: str, hot: bool) -> None:
        with self._lock:
            h, _ = self._get(weight)
            self._weights[weight] = (h, bool(hot))

    def handle(self, weight: str) -> RefAllocation:
        with self._lock:
            return self._get(weight)[0]

    def address(self, weight: str) -> int | None:
        """Where a loaded weight's bytes are (``None``: not loaded) -- the
        contract's optional ``ModelResidencyHolder.address``."""
        with self._lock:
            got = self._weights.get(weight) if isinstance(weight, str) else None
            return None if got is None else got[0].allocation.address

    def footprint(self, weight: str) -> int | None:
        """The real footprint of a loaded weight (``None``: not loaded) --
        the contract's optional ``ModelResidencyHolder.footprint``."""
        with self._lock:
            got = self._weights.get(weight) if isinstance(weight, str) else None
            return None if got is None else got[0].allocation.footprint

    def use(self, weight: str, fence: Fence) -> None:
        """Record in-flight work reading the weight (it is not released before ``fence``)."""
        with self._lock:
            self._get(weight)[0].use(fence)

    def unload(self, weight: str) -> None:
        """Drop the weight: its release is queued behind its fences."""
        with self._lock:
            h, _ = self._get(weight)
            del self._weights[weight]
        h.close()

    def weights(self) -> dict[str, tuple[int, bool]]:
        with self._lock:
            return {w: (h.footprint, hot) for w, (h, hot) in self._weights.items()}

    def resident_bytes(self) -> int:
        with self._lock:
            return sum(h.footprint for h, _ in self._weights.values())

    def on_pressure(self, ticket: Ticket) -> int:
        """Evict cold weights not used by in-flight work, largest first, until
        the ticket's amount is covered; return the bytes actually freed (0 is
        a valid answer: hot or busy weights are never victims)."""
        with self._lock:
            cold = sorted(
                ((h.footprint, w) for w, (h, hot) in self._weights.items() if not hot and not h.pending_fences()),
                reverse=True,
            )
            victims, planned = [], 0
            for fp, w in cold:
                if planned >= ticket.amount:
                    break
                victims.append(w)
                planned += fp
            freed = [0]
            for w in victims:
                h, _ = self._weights.pop(w)
                h.on_released(lambda n: freed.__setitem__(0, freed[0] + n))
                h.close()
        self.binding.ep.poll()
        return freed[0]


# --------------------------------------------------------------------------
# KvPageStore
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class KvView:
    """What the model sees of a request's KV: a stable address and the bytes backed."""

    request: str
    address: int
    nbytes: int
    version: int


@dataclass
class _SharedPage:
    """One KV page moved into a SharedMapping physical handle so several
    requests can map it: physical and charge counted once (its own lease)."""

    handle: PhysicalHandle
    lease: Lease
    users: set[str] = field(default_factory=set)


@dataclass
class _Request:
    name: str
    res: RefReservation
    max_bytes: int
    view: KvView
    shared: dict[int, _SharedPage] = field(default_factory=dict)   # page offset -> shared page mapped here
    prefix_of: str | None = None
    evictable: bool = False


class KvPageStore:
    """KV pages per request, grown transactionally, prefixes shared through SharedMapping.

    Sharing is page-granular: when a request opens with ``prefix_of=A,
    prefix_bytes=P``, each of A's first ``P / page`` pages that is still
    private is moved, with its bytes, into a one-page physical handle mapped
    read-only back at the same address in A (the charge is carved out of A's
    leases into the page's own lease: nothing is charged twice, nothing
    new is granted), and every such page is mapped read-only into the new
    request.  Different requests may share prefixes of different lengths.
    A shared page is unmapped when a request mapping it is released, and
    freed (and refunded) when the last one goes (invariant S13).
    """

    def __init__(self, binding: ReferenceBinding, name: str = "kv") -> None:
        self.name = name
        self.binding = binding
        self._lock = threading.RLock()
        self._reqs: dict[str, _Request] = {}
        self.prefix_freed = 0    # bytes of shared pages freed so far (their last user left)

    # -- helpers ----------------------------------------------------------

    def _req(self, request: str) -> _Request:
        r = self._reqs.get(request) if isinstance(request, str) else None
        if r is None:
            raise InvalidRequest(f"KV request {request!r} is not open")
        return r

    def _shared(self, res: RefReservation):
        sm = self.binding.manager.mechanism(res.mechanism_id).shared_mapping()
        if sm is None:
            raise Unsupported(f"mechanism {res.mechanism_id} has no SharedMapping: prefixes cannot be shared")
        return sm

    def view(self, request: str) -> KvView:
        with self._lock:
            return self._req(request).view

    def requests(self) -> list[str]:
        with self._lock:
            return list(self._reqs)

    def prefix_users(self, request: str) -> set[str]:
        """Requests mapping the shared first page of ``request`` (empty if it has none)."""
        with self._lock:
            sp = self._req(request).shared.get(0)
            return set() if sp is None else set(sp.users)

    def shared_bytes(self) -> int:
        """Physical bytes of live shared pages (each counted once)."""
        with self._lock:
            pages = {id(sp): sp for r in self._reqs.values() for sp in r.shared.values()}
            return sum(sp.handle.size for sp in pages.values())

    def reservation(self, request: str) -> RefReservation:
        with self._lock:
            return self._req(request).res

    def address(self, request: str) -> int | None:
        """The stable address of an open request's KV (``None``: not open) --
        the contract's optional ``KvPageStoreHolder.address``."""
        with self._lock:
            r = self._reqs.get(request) if isinstance(request, str) else None
            return None if r is None else r.res.address

    # -- open / grow ------------------------------------------------------

    def open(self, request: str, max_bytes: int, *, prefix_of: str | None = None, prefix_bytes: int = 0) -> None:
        """Step 1: reserve ``max_bytes`` of VA (no physical pages).  With
        ``prefix_of``, map that request's first ``prefix_bytes`` (page
        aligned, already committed there) read-only here, sharing its
        physical pages.  Unsupported without VirtualBacking (or, for a
        prefix, SharedMapping); InvalidRequest for a prefix longer than what
        the origin has backed."""
        _check_name(request, "request")
        check_size(max_bytes, "max_bytes")
        caps = self.binding.capabilities()
        if not caps.virtual_backing or (prefix_of is not None and not caps.shared_mapping):
            raise Unsupported(f"mechanism {caps.mechanism_id} lacks "
                              + ("VirtualBacking" if not caps.virtual_backing else "SharedMapping"))
        with self._lock:
            if request in self._reqs:
                raise InvalidRequest(f"KV request {request!r} is already open")
            src = None
            if prefix_of is not None:
                src = self._req(prefix_of)
                self._shared(src.res)
                page = src.res.backing.granularity()
                if not is_int(prefix_bytes) or prefix_bytes <= 0 or prefix_bytes % page:
                    raise InvalidRequest(f"prefix_bytes must be a positive multiple of {page}, got {prefix_bytes!r}")
                if prefix_bytes > src.view.nbytes or prefix_bytes > max_bytes:
                    raise InvalidRequest(
                        f"prefix of {prefix_bytes} bytes exceeds {prefix_of!r}'s {src.view.nbytes} backed bytes "
                        f"or the new request's {max_bytes}"
                    )
            elif prefix_bytes:
                raise InvalidRequest("prefix_bytes without prefix_of")
            res = self.binding.reserve(self.name, max_bytes)
            req = _Request(request, res, max_bytes, KvView(request, res.address, 0, 0), prefix_of=prefix_of)
            self._install_leave(req)
            if src is not None:
                try:
                    pages = self._share_prefix(src, prefix_bytes)
                except BaseException:
                    res.close()
                    self.binding.ep.poll()
                    raise
                sm = self._shared(res)
                for off, sp in pages:
                    sm.map(sp.handle, res.allocation, off, read_only=True)
                    sp.users.add(request)
                    req.shared[off] = sp
                req.view = KvView(request, res.address, prefix_bytes, 1)
            self._reqs[request] = req

    def _install_leave(self, req: _Request) -> None:
        """Before the reservation's release: unmap its shared pages; free
        (and refund) those whose last user this was."""
        gov = self.binding.governor

        def leave() -> None:
            if not req.shared:
                return
            sm, va = self._shared(req.res), req.res.allocation
            for off, sp in sorted(req.shared.items()):
                sm.unmap(va, off, sp.handle.size)
                with self._lock:
                    sp.users.discard(req.name)
                    last = not sp.users
                if last:
                    sm.release(sp.handle)
                    gov.refund(sp.lease)
                    with self._lock:
                        self.prefix_freed += sp.handle.size
            req.shared.clear()

        req.res.before_release(leave)

    def _share_prefix(self, src: _Request, size: int) -> list[tuple[int, _SharedPage]]:
        """The shared pages covering ``src``'s first ``size`` bytes, moving
        each still-private page into a one-page physical handle (same bytes,
        same address, now read-only; its charge carved out of ``src``'s leases)."""
        ep, gov, res = self.binding.ep, self.binding.governor, src.res
        sm = self._shared(res)
        page = res.backing.granularity()
        todo = [off for off in range(0, size, page) if off not in src.shared]
        if todo:
            for f in res.pending_fences():      # the holder waits for its own in-flight work
                ep.run_until(f) if hasattr(ep, "run_until") else ep.synchronize(f.stream)
        stream = getattr(ep, "default_stream", 0)
        for off in todo:
            data = ep.read(stream, res.address + off, page)
            res.backing.decommit_range(res.allocation, off, off + page)   # one page out ...
            handle = sm.create(page)                                       # ... one page in
            if data.count(0) != len(data):          # any non-zero byte (C speed, not a Python loop)
                sm.map(handle, res.allocation, off, read_only=False)
                ep.run_until(ep.write(stream, res.address + off, data)) if hasattr(ep, "run_until") \
                    else (ep.write(stream, res.address + off, data), ep.synchronize(stream))
                sm.unmap(res.allocation, off, page)
            sm.map(handle, res.allocation, off, read_only=True)
            with res.lock:
                res.pages.discard(off)
                lease = self._carve(res, page)
            sp = _SharedPage(handle, lease, {src.name})
            src.shared[off] = sp
        return [(off, src.shared[off]) for off in range(0, size, page)]

    def _carve(self, res: RefReservation, n: int) -> Lease:
        """Move ``n`` bytes of charge from the reservation's newest leases
        into one new lease (no change to the ledger)."""
        gov = self.binding.governor
        for old in reversed(list(res.leases)):
            if gov.lease_bytes(old) >= n:
                new = gov.split(old, n)
                if gov.lease_bytes(old) == 0:
                    res.leases.remove(old)
                return new
        # spread over several leases: carve what each has, then merge
        parts, left = [], n
        for old in reversed(list(res.leases)):
            take = min(left, gov.lease_bytes(old))
            if take:
                parts.append(gov.split(old, take))
                left -= take
            if gov.lease_bytes(old) == 0:
                res.leases.remove(old)
            if not left:
                break
        return gov.merge(parts)

    def grow(self, request: str, new_bytes: int, *, fail_at: int | None = None) -> int:
        """Grow the request's backed KV to ``round_up(new_bytes)`` by the
        6-step transaction; return the bytes newly committed (0 if already
        there).  On failure at step 4 or 5 (injected by ``fail_at``, or real:
        GrantDenied at 3, OutOfMemory at 4) everything is rolled back and the
        error re-raised."""
        if fail_at not in (None, 4, 5):
            raise InvalidRequest(f"fail_at must be None, 4 or 5, got {fail_at!r}")
        with self._lock:
            req = self._req(request)
            check_size(new_bytes, "new_bytes")
            if new_bytes > req.max_bytes:
                raise InvalidRequest(f"{request!r} grows to {new_bytes} past its {req.max_bytes}-byte reservation")
            page = req.res.backing.granularity()
            # step 2: the physical bytes needed for this growth
            cur, target = req.view.nbytes, round_up(new_bytes, page)
            if target <= cur:
                return 0
            target = min(target, req.res.allocation.size)
            txn = self.binding.transaction(req.res, cur, target)      # step 3
            try:
                if fail_at == 4:                                        # step 4, failing part way
                    if target - cur > page:
                        txn.commit(cur, cur + page)
                    raise InjectedFailure(4)
                txn.commit(cur, target)                                  # step 4
                new_view = KvView(request, req.view.address, target, req.view.version + 1)  # step 5
                if fail_at == 5:
                    raise InjectedFailure(5)
                n = txn.finish()                                         # step 6
                req.view = new_view
                return n
            except BaseException:
                txn.rollback()
                raise

    # -- queries, use, close, pressure -------------------------------------

    def committed(self, request: str) -> int:
        """Bytes backed behind the request's address: its private pages
        (read from the backing) plus the shared pages mapped there."""
        with self._lock:
            req = self._req(request)
            return req.res.committed() + sum(sp.handle.size for sp in req.shared.values())

    def use(self, request: str, fence: Fence) -> None:
        """In-flight work uses the request's pages until ``fence``."""
        with self._lock:
            self._req(request).res.use(fence)

    def set_evictable(self, request: str, evictable: bool = True) -> None:
        """Mark a request (finished, preempted) as a victim this store may evict under pressure."""
        with self._lock:
            self._req(request).evictable = bool(evictable)

    def close(self, request: str) -> None:
        """Drop the request: its unmap/decommit/release is queued behind its fences."""
        with self._lock:
            req = self._req(request)
            del self._reqs[request]
        req.res.close()

    def on_pressure(self, ticket: Ticket) -> int:
        """Evict evictable requests whose pages no in-flight work uses; pages
        used by in-flight kernels are never released, so the answer may be 0."""
        with self._lock:
            victims, planned = [], 0
            for name, req in sorted(self._reqs.items()):
                if planned >= ticket.amount:
                    break
                if req.evictable and not req.res.pending_fences():
                    victims.append(req)
                    planned += req.res.committed()
            freed = [0]
            before = self.prefix_freed
            for req in victims:
                del self._reqs[req.name]
                req.res.on_released(lambda n: freed.__setitem__(0, freed[0] + n))
                req.res.close()
        self.binding.ep.poll()
        return freed[0] + (self.prefix_freed - before)
