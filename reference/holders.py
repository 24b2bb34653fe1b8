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
class _Prefix:
    """A shared system-prompt prefix: one physical handle, charged once."""

    handle: PhysicalHandle
    lease: Lease
    users: set[str] = field(default_factory=set)


@dataclass
class _Request:
    name: str
    res: RefReservation
    max_bytes: int
    view: KvView
    prefix: _Prefix | None = None
    evictable: bool = False


class KvPageStore:
    """KV pages per request, grown transactionally, prefixes shared through SharedMapping."""

    def __init__(self, binding: ReferenceBinding, name: str = "kv") -> None:
        self.name = name
        self.binding = binding
        self._lock = threading.RLock()
        self._reqs: dict[str, _Request] = {}
        self.prefix_freed = 0    # bytes of shared prefixes freed so far (their last user left)

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
        with self._lock:
            p = self._req(request).prefix
            return set() if p is None else set(p.users)

    def shared_bytes(self) -> int:
        """Physical bytes of live shared prefixes (each counted once)."""
        with self._lock:
            return sum(p.handle.size for p in {id(r.prefix): r.prefix for r in self._reqs.values() if r.prefix}.values())

    def reservation(self, request: str) -> RefReservation:
        with self._lock:
            return self._req(request).res

    # -- open / grow ------------------------------------------------------

    def open(self, request: str, max_bytes: int, *, prefix_of: str | None = None, prefix_bytes: int = 0) -> None:
        """Step 1: reserve ``max_bytes`` of VA (no physical pages).  With
        ``prefix_of``, map that request's first ``prefix_bytes`` (page
        aligned, already committed there) read-only here, sharing its
        physical pages (the first time, they are moved into a shared handle
        with the same bytes; the charge stays counted once)."""
        _check_name(request, "request")
        check_size(max_bytes, "max_bytes")
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
                if src.prefix is not None and src.prefix.handle.size != prefix_bytes:
                    raise InvalidRequest(f"{prefix_of!r} shares a {src.prefix.handle.size}-byte prefix, not {prefix_bytes}")
            elif prefix_bytes:
                raise InvalidRequest("prefix_bytes without prefix_of")
            res = self.binding.reserve(self.name, max_bytes)
            req = _Request(request, res, max_bytes, KvView(request, res.address, 0, 0))
            try:
                if src is not None:
                    prefix = src.prefix or self._make_prefix(src, prefix_bytes)
                    sm = self._shared(res)
                    sm.map(prefix.handle, res.allocation, 0, read_only=True)
                    self._join(req, prefix)
                    req.view = KvView(request, res.address, prefix_bytes, 1)
            except BaseException:
                res.close()
                self.binding.ep.poll()
                raise
            self._reqs[request] = req

    def _join(self, req: _Request, prefix: _Prefix) -> None:
        req.prefix = prefix
        prefix.users.add(req.name)
        sm, va, size = self._shared(req.res), req.res.allocation, prefix.handle.size
        gov = self.binding.governor

        def leave() -> None:
            sm.unmap(va, 0, size)
            with self._lock:
                prefix.users.discard(req.name)
                last = not prefix.users
            if last:
                sm.release(prefix.handle)
                gov.refund(prefix.lease)
                with self._lock:
                    self.prefix_freed += size

        req.res.before_release(leave)

    def _make_prefix(self, src: _Request, size: int) -> _Prefix:
        """Move ``src``'s first ``size`` bytes into a shared physical handle
        (same bytes, same address, now read-only), charged once."""
        ep, gov, res = self.binding.ep, self.binding.governor, src.res
        sm = self._shared(res)
        for f in res.pending_fences():      # the holder waits for its own in-flight work
            ep.run_until(f)
        page = res.backing.granularity()
        grant = gov.reserve(self.name, size)
        try:
            handle = sm.create(size)
        except BaseException:
            gov.cancel(grant)
            raise
        tmp = sm.reserve(ReserveRequest(size))
        try:
            sm.map(handle, tmp, 0, read_only=False)
            stream = ep.default_stream if hasattr(ep, "default_stream") else 0
            last = None
            for off in range(0, size, page):
                data = ep.read(stream, res.address + off, page)
                if any(data):
                    last = ep.write(stream, tmp.address + off, data)
            if last is not None:
                ep.run_until(last) if hasattr(ep, "run_until") else ep.synchronize(stream)
            sm.unmap(tmp, 0, size)
        except BaseException:
            sm.release(handle)
            gov.cancel(grant)
            raise
        finally:
            sm.free_reservation(tmp)
        # swap: the private pages go, the shared handle comes, at the same address
        res.backing.decommit_range(res.allocation, 0, size)
        sm.map(handle, res.allocation, 0, read_only=True)
        lease = gov.commit(grant, size)
        left = size
        with res.lock:
            res.pages.difference_update(range(0, size, page))
            for old in list(res.leases):
                if not left:
                    break
                take = min(left, gov.lease_bytes(old))
                gov.refund(old, take)
                left -= take
                if gov.lease_bytes(old) == 0:
                    res.leases.remove(old)
        prefix = _Prefix(handle, lease)
        self._join(src, prefix)
        return prefix

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
        (read from the backing) plus its shared prefix."""
        with self._lock:
            req = self._req(request)
            return req.res.committed() + (req.prefix.handle.size if req.prefix else 0)

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
