"""Holders: they alone understand the data and choose victims.

Seed 000: *Only the holder knows what can be released*::

    ModelResidency:
      two cold weights can free 700 MB

    KvPageStore:
      all pages are in use by in-flight kernels, can free only 0

*The Governor must not unmap a holder's data directly.  A holder may
legitimately release 0 bytes.*

**ModelResidency** holds four weights, ``w0..w3`` of 1, 2, 4 and 8 pages
(distinct powers of two, so the bytes a holder reports released name the
weights it released).  Hot weights are never victims; cold ones may be.

**KvPageStore** grows each request's KV by the seed's six-step transaction::

    1. VirtualBacking.reserve(10 GB), reserving a stable address;
    2. the Holder computes the physical bytes needed for the next growth;
    3. the Governor provides a provisional grant for the growth amount;
    4. the EP/backing runs commit_range;
    5. the Holder updates the KV view and logical state;
    6. on success, commit the charge.

*If step 4 or 5 fails: roll back the provisional mapping; return the grant;
keep the old KV view and request state; do not expose a partially committed
new state.*  A request may start with a read-only prefix mapped from another
request's physical pages (SharedMapping): those pages are charged once, to
the request that committed them, and freed only after the last request
mapping them is gone (S13).  In this model every KV page belongs to an open
request and is not a victim: the store answers pressure with 0.

Answering a ticket (``respond``): the holder releases what it chooses, its
releases run through the deferred-free queue (a weight has no pending
fences, so the queue frees it at once) and are refunded; then the Governor
records the answer and moves those refunded bytes into the ticket.
"""

from __future__ import annotations

from typing import Any

from memspec.spec import kernels as K
from memspec.spec.api import Fence, TicketState
from memspec.spec.core import Check, Domain, Raises, Returns, action, booleans, only, outcomes
from memspec.spec.errors import GrantDenied, InvalidRange, InvalidRequest, InvalidTicket, MemspecError, OutOfMemory, Unsupported
from memspec.spec.state import KvRequest, Seen, SysState, Weight, add, new_ref
from memspec.spec.manager import capability_refusal_is_stale, context_alive, drop_owned, new_owned, physical_total
from memspec.spec.governor import KV, WEIGHTS, charge_at_footprint, holder_name, ticket_receive
from memspec.spec.ep import PENDING, done_flags, enqueue, flags_ok, known_flags, launch, new_entry, refund, run_done

WEIGHT_PAGES = {"w0": 1, "w1": 2, "w2": 4, "w3": 8}


def init_holders(s: SysState) -> None:
    for name, pages in WEIGHT_PAGES.items():
        s.weights[name] = Weight(name, pages)


# ==========================================================================
# ModelResidency
# ==========================================================================


def _absent_weight(s: SysState, c: Any) -> tuple[str, bool, int]:
    names = [w.name for w in s.weights.values() if not w.resident]
    name = names[c.integer(0, len(names) - 1)]
    return (name, c.boolean(), s.weights[name].pages * s.page)


def _perform_load(sut: Any, weight: tuple[str, bool, int]) -> Any:
    sut.weights.load(weight[0], weight[2], hot=weight[1])
    probe = getattr(sut.weights, "footprint", None)   # optional: the real footprint of a loaded weight
    fp = probe(weight[0]) if callable(probe) else None
    return Seen(None, {"footprint": fp if fp is not None else weight[2]})


@action(role="ModelResidency",
        params={"weight": Domain("(weight, hot, bytes): a weight not resident", _absent_weight,
                                 lambda s: any(not w.resident for w in s.weights.values()))},
        perform=_perform_load,
        enabled=context_alive, invariants=("S2", "S8", "S11"), weight=2)
def load_weight(s: SysState, weight: tuple[str, bool, int]) -> Any:
    """Load a weight (hot or cold) through the binding, charged to ModelResidency.

    The allocation transaction as for any allocation: GrantDenied if the
    Governor cannot approve its real footprint, OutOfMemory if the device
    cannot (unless it holds nothing and the declared bound fits), the ledger
    unchanged on failure.  On success its pages are resident and charged at
    their real footprint (*act on the real allocated bytes*; a holder that
    does not say it, ``ModelResidencyHolder.footprint``, is taken at the
    bytes asked for).
    """
    from memspec.spec.manager import planned_footprint

    name, hot, n = weight
    w = s.weights[name]
    if n > s.free:
        return only(GrantDenied, blame="S8", describe=f"{n} > free {s.free}")
    installed = s.registry.installed
    hi, strict, room = planned_footprint(s, n)

    def then(v: Seen) -> int:
        fp = v["footprint"]
        charge_at_footprint(s, WEIGHTS, n, fp)
        o = new_owned(s, "weight", WEIGHTS, n, fp, installed)
        w.resident, w.hot, w.owned = True, hot, o.ref
        return o.ref   # the weight's memory (its data is checked while resident)

    checks = [Check("S8", "footprint", lambda v: v["footprint"] >= n, f"footprint >= {n}")]
    if hi is not None:
        checks.append(Check("S8", "bound", lambda v: v["footprint"] <= hi, f"footprint <= {hi} (the declared bound)"))
    checks.append(Check("S8", "charge", lambda v: v["footprint"] <= s.free,
                        f"the real footprint charged within the {s.free} bytes free (else refused)"))
    wfp = hi if hi is not None else n
    branches: list[Any] = [Returns("resident, charged at its footprint",
                                   lambda v: isinstance(v, Seen) and type(v["footprint"]) is int, then,
                                   (lambda: Seen(None, {"footprint": wfp})) if wfp <= s.free else None,
                                   checks=tuple(checks), id="returns resident")]
    if hi is None or hi > s.free:
        branches.append(Raises(GrantDenied, "the real footprint does not fit what is free; ledger unchanged"))
    if not (physical_total(s) == 0 and strict and hi is not None and hi <= room):
        branches.append(Raises(OutOfMemory, "the device could not; ledger unchanged"))
    return outcomes(*branches, blame="S8")


def _resident(s: SysState, c: Any) -> str:
    names = [w.name for w in s.weights.values() if w.resident]
    return names[c.integer(0, len(names) - 1)]


RESIDENT = Domain("a resident weight", _resident, lambda s: any(w.resident for w in s.weights.values()))


@action(role="ModelResidency", params={"weight": RESIDENT, "hot": booleans()},
        perform=lambda sut, weight, hot: sut.weights.set_hot(weight, hot), invariants=("S6",))
def set_hot(s: SysState, weight: str, hot: bool) -> Any:
    """Mark a resident weight hot (in use: never a victim) or cold (evictable).

    Returns None.
    """

    def then(_v: Any) -> None:
        s.weights[weight].hot = hot

    owned = s.weights[weight].owned
    return outcomes(Returns("None", lambda v: v is None, then, lambda: None), blame="S6",
                    touched=(owned,) if owned is not None else ())


@action(role="ModelResidency", params={"weight": RESIDENT},
        perform=lambda sut, weight: sut.weights.unload(weight), invariants=("S7", "S11"))
def unload_weight(s: SysState, weight: str) -> Any:
    """Unload a resident weight: its owning allocation is dropped.

    Returns None having only enqueued the release; the charge is refunded
    when the queue runs it (S7).
    """
    w = s.weights[weight]

    def then(_v: Any) -> None:
        evict(s, w, by="holder")

    return outcomes(Returns("None (release queued)", lambda v: v is None, then, lambda: None), blame="S7")


def evict(s: SysState, w: Weight, *, by: str, pressure: bool = False) -> None:
    """A weight leaves residency: its owning allocation is dropped (queued).
    Records S6: only the holder releases, and never a hot weight under pressure."""
    if by != "holder":
        s.governor_evictions += 1
    if pressure and w.hot:
        s.hot_evictions += 1
    o = s.owned[w.owned]  # type: ignore[index]
    w.resident = False
    w.owned = None
    drop_owned(s, o, o.fences)


def weight_footprint(s: SysState, w: Weight) -> int:
    """The bytes a resident weight's charge covers: its real footprint."""
    o = s.owned.get(w.owned) if w.owned is not None else None
    return o.footprint if o is not None else w.pages * s.page


def victims(s: SysState, released: int) -> list[Weight] | None:
    """The cold resident weights whose real footprints sum to ``released``
    bytes, or None if no set of cold weights does (a set that needs a hot
    weight is not one: *only cold weights may be evicted*).  Four weights:
    every subset is tried."""
    res = [w for w in s.weights.values() if w.resident]
    for n in range(1 << len(res)):
        pick = [w for i, w in enumerate(res) if n >> i & 1]
        if sum(weight_footprint(s, w) for w in pick) == released and not any(w.hot for w in pick):
            return pick
    return None


# ==========================================================================
# Answering a pressure ticket
# ==========================================================================


def _draw_answer(s: SysState, c: Any) -> tuple[int, str, bool]:
    t = s.ticket_refs.at(c.integer(0, len(s.ticket_refs) - 1))
    return (t, c.choice((WEIGHTS, KV)), s.tickets[t].state in TicketState.TERMINAL)


def _perform_respond(sut: Any, answer: tuple[int, str, bool], pending: Any) -> Seen:
    t_ref, holder, terminal = answer
    t = sut.ref(t_ref)
    name = holder_name(sut, holder)
    if terminal:  # a terminal ticket: nothing to release; the Governor refuses the answer
        sut.governor.respond(t, name, 0)
        return Seen(None, {})
    done = done_flags(sut, pending)
    role = sut.weights if holder == WEIGHTS else sut.kv
    queued = sut.ep.pending_releases()
    released = role.on_pressure(t)
    sut.ep.poll()
    t2 = sut.governor.respond(t, name, released)
    return Seen(None, {"done": done, "released": released, "state": t2.state, "held": t2.held,
                       "drained": queued - sut.ep.pending_releases()})


@action(role="Holder",
        params={"answer": Domain("(ticket, holder, terminal?): a ticket and ModelResidency or KvPageStore",
                                 _draw_answer, lambda s: len(s.ticket_refs) > 0),
                "pending": PENDING},
        perform=_perform_respond, invariants=("S6", "S15", "S11"), weight=3)
def respond(s: SysState, answer: tuple[int, str, bool], pending: Any) -> Any:
    """A holder answers a pressure ticket: ``on_pressure``, then ``Governor.respond``.

    Only the holder chooses victims (S6).  ModelResidency may release any set
    of its *cold* weights (never a hot one) and reports their bytes;
    KvPageStore picks no victim (*all pages are in use by in-flight kernels,
    can free only 0*) and reports 0, or at most what its own queued releases
    that ran meanwhile refunded.  The releases run through the deferred-free queue and are
    refunded; then the Governor moves exactly the reported bytes from free
    into the ticket, which becomes granted once it holds its amount.  A
    terminal ticket takes no answer: InvalidTicket.

    The answer runs the deferred-free queue (the holder's ``on_pressure``
    and the EP's ``poll``) as ``poll`` does: of the releases queued before
    it, only those whose fences are all done may run (the victims' fresh
    releases may run too).  The queue shrinking by more than the releases
    reported done ran one before its fence: S4's clause
    ``release-before-fence`` (*GPU release must obey stream/fence
    ordering*), whatever figure the early refund then moves.
    """
    t_ref, holder, terminal = answer
    t = s.tickets[t_ref]
    if terminal:
        return only(InvalidTicket, blame="S15", describe=f"the ticket is {t.state}")

    def chosen(v: Seen) -> list[Weight] | None:
        r = v["released"]
        if type(r) is not int or r < 0:
            return None
        if holder == KV:  # no victims; it may report what queued releases of its own refunded meanwhile
            return [] if r <= s.charged_by.get(KV, 0) else None
        return victims(s, r)

    def accepts(v: Any) -> bool:
        if not isinstance(v, Seen) or not flags_ok(s, pending, v["done"]) or chosen(v) is None:
            return False
        held = t.held + v["released"]
        state = TicketState.GRANTED if (t.state == TicketState.GRANTED or held >= t.amount) else TicketState.PENDING
        return v["state"] == state and v["held"] == held

    def then(v: Seen) -> None:
        for w in chosen(v) or []:
            evict(s, w, by="holder", pressure=True)
        kv_before = s.charged_by.get(KV, 0)
        run_done(s, pending, v["done"])
        if holder == KV and v["released"] > kv_before - s.charged_by.get(KV, 0):
            s.overclaims += 1  # it reported bytes no release of its own refunded
        # the victims' releases had no fences pending: the queue freed them now
        fresh = [e for e in list(s.queue.values()) if e.seq > max((p[0] for p in pending), default=0)]
        run_done(s, tuple((e.seq, tuple(e.fences)) for e in fresh), [True] * len(fresh))
        ticket_receive(s, t, v["released"])

    def witness() -> Seen:
        cold = [w for w in s.weights.values() if w.resident and not w.hot and holder == WEIGHTS]
        r = sum(weight_footprint(s, w) for w in cold[:2])
        held = t.held + r
        state = TicketState.GRANTED if (t.state == TicketState.GRANTED or held >= t.amount) else TicketState.PENDING
        done = known_flags(s, pending)
        return Seen(None, {"done": done, "released": r, "state": state, "held": held,
                           "drained": sum(1 for d in done if d)})

    exact = all(s.queue[seq].exact for seq, _f in pending if seq in s.queue)

    def fenced_ok(v: Any) -> bool:
        """The queue (as the EP counts it) drained by at most the releases reported done (the
        victims' own releases, queued and run inside the answer, cancel out).  A queue holding an
        object the implementation may release in pieces (a KV request's pages) is bounded only
        when no release was reported done: then nothing of it may run."""
        if "drained" not in v.facts:   # an answer built without the queue's count (a spec-side walk): no claim
            return True
        drained = v["drained"]
        may = sum(1 for d in v["done"] if d)
        return type(drained) is int and drained <= (may if exact or may == 0 else drained)

    return outcomes(Returns("the bytes the holder's releases refunded, now held by the ticket", accepts, then, witness,
                            checks=(Check("S4", "release-before-fence", fenced_ok,
                                          "the queue ran no release whose fences were not all done"),)),
                    blame="S6", touched=(t_ref,))


# ==========================================================================
# KvPageStore
# ==========================================================================


def kv_name(ref: int) -> str:
    """The implementation's name of KV request ``ref``."""
    return f"kv{ref}"


def _open_requests(s: SysState) -> list[int]:
    return [r for r, q in s.kv.items() if q.state == "open"]


def _draw_open(s: SysState, c: Any) -> tuple[int, int, int | None, int]:
    origins = [r for r in _open_requests(s) if s.kv[r].prefix_of is None and s.kv[r].own >= s.page]
    if origins and c.integer(0, 2) == 0:
        o = origins[c.integer(0, len(origins) - 1)]
        have = s.kv[o].own // s.page
        p = c.integer(1, have + (1 if c.integer(0, 4) == 0 else 0))  # sometimes more than committed
        return (s.next_ref, c.integer(max(4, p), 9) * s.page, o, p * s.page)
    return (s.next_ref, c.integer(4, 8) * s.page, None, 0)


def _perform_open(sut: Any, request: tuple[int, int, int | None, int]) -> None:
    ref, max_bytes, origin, prefix = request
    if origin is None:
        sut.kv.open(kv_name(ref), max_bytes)
    else:
        sut.kv.open(kv_name(ref), max_bytes, prefix_of=kv_name(origin), prefix_bytes=prefix)


@action(role="KvPageStore",
        params={"request": Domain("(new request, max bytes, prefix_of, prefix bytes): 4..8 pages, sometimes a "
                                  "read-only prefix of an open request", _draw_open)},
        perform=_perform_open, enabled=lambda s: context_alive(s) and len(_open_requests(s)) < 4,
        invariants=("S5", "S13", "S12"), weight=2)
def kv_open(s: SysState, request: tuple[int, int, int | None, int]) -> Any:
    """Open a KV request: step 1, reserve ``max_bytes`` of stable virtual address.

    Needs the installed mechanism's VirtualBacking (and SharedMapping for a
    prefix): without it, Unsupported (an explicit refusal, S5); with it,
    never Unsupported (S3's clause ``capability-refused``: a refusal from an
    earlier mechanism's snapshot).  With a
    prefix, the first ``prefix_bytes`` are mapped read-only from the origin's
    physical pages -- no new charge (S13: charged once); a prefix larger than
    what the origin committed: InvalidRequest or InvalidRange.  Returns None.
    """
    ref, max_bytes, origin, prefix = request
    vb, sm = s.registry.capabilities[s.registry.installed]
    if not vb or (origin is not None and not sm):
        return only(Unsupported, blame="S5", describe="the installed mechanism lacks the capability")
    if origin is not None and (prefix > s.kv[origin].own or prefix > max_bytes):
        return outcomes(Raises(InvalidRequest, "prefix larger than the origin's committed KV"),
                        Raises(InvalidRange, "prefix larger than the origin's committed KV"), blame="S13",
                        forbidden=capability_refusal_is_stale(s, "VirtualBacking and SharedMapping"))
    installed = s.registry.installed

    def then(_v: Any) -> None:
        got = new_ref(s)
        assert got == ref, "request ids are drawn as the next reference"
        q = KvRequest(kv_name(ref), max_bytes, installed, prefix=prefix, prefix_of=origin)
        s.kv[ref] = q
        if origin is not None:
            s.kv[origin].sharers[ref] = prefix
            s.kv[origin].shared_upto = max(s.kv[origin].shared_upto, prefix)
        s.live_objects += 1
        return ref  # type: ignore[return-value]

    return outcomes(Returns("None", lambda v: v is None, then, lambda: None), blame="S5",
                    touched=(ref,) if origin is None else (ref, origin),
                    forbidden=capability_refusal_is_stale(s, "VirtualBacking" if origin is None
                                                          else "VirtualBacking and SharedMapping"))


def _draw_grow(s: SysState, c: Any) -> tuple[int, int, int | None]:
    opened = _open_requests(s)
    r = opened[c.integer(0, len(opened) - 1)]
    q = s.kv[r]
    k = c.integer(0, 9)
    if k <= 6:
        new = q.committed + c.integer(1, 2 * s.page)
    elif k == 7:
        new = q.committed
    else:
        new = q.max_bytes + c.integer(1, s.page)
    return (r, new, c.choice((None, None, None, 4, 5)))


def _perform_grow(sut: Any, growth: tuple[int, int, int | None]) -> int:
    r, new, fail_at = growth
    return sut.kv.grow(kv_name(r), new, fail_at=fail_at)


@action(role="KvPageStore",
        params={"growth": Domain("(request, new bytes, fail_at): mostly 1 byte..2 pages more, sometimes no more, "
                                 "past max; a failure injected at step 4 or 5 one time in five",
                                 _draw_grow, lambda s: bool(_open_requests(s)))},
        perform=_perform_grow, invariants=("S2", "S9", "S11", "S12"), weight=4)
def kv_grow(s: SysState, growth: tuple[int, int, int | None]) -> Any:
    """Grow a request's committed KV to ``new_bytes`` (page rounded) by the six-step transaction.

    Past ``max_bytes``: InvalidRange (or InvalidRequest).  No growth needed:
    returns 0 (or InvalidRequest).  The growth ``round_up(new) -
    committed`` must be granted first (GrantDenied if it cannot be), then
    committed, then charged (S2).  A failure injected at step 4 or 5, or an
    OutOfMemory at step 4, is re-raised after the rollback: the mapping is
    undone, the grant returned and the old view kept (S9).  Success returns
    exactly the bytes newly committed; the address never moves (S12).
    """
    r, new, fail_at = growth
    q = s.kv[r]
    if new > q.max_bytes:
        return outcomes(Raises(InvalidRange, "past max_bytes"), Raises(InvalidRequest, "past max_bytes"), blame="S9",
                        touched=(r,))
    delta = K.round_up(new, s.page) - q.committed
    if delta <= 0:
        return outcomes(Returns("0 (nothing to grow)", lambda v: v == 0, witness=lambda: 0),
                        Raises(InvalidRequest, "nothing to grow"), blame="S5", touched=(r,))
    if delta > s.free:
        return only(GrantDenied, blame="S9", describe=f"{delta} > free {s.free}; nothing changes", touched=(r,))
    if fail_at in (4, 5):
        return only(MemspecError, blame="S9", describe=f"injected failure at step {fail_at}: rolled back", touched=(r,))

    def then(_v: int) -> None:
        grow_commit(s, q, delta)

    return outcomes(
        Returns(f"exactly {delta}", lambda v: type(v) is int and v == delta, then, lambda: delta),
        Raises(OutOfMemory, "step 4 found no physical pages: rolled back"),
        blame="S9",
        touched=(r,),
    )


def grow_commit(s: SysState, q: KvRequest, delta: int) -> None:
    """Steps 3-6 on success: grant, commit the pages, update the view, charge."""
    charge_at_footprint(s, KV, delta, delta)
    add(s.physical_by, KV, delta)
    q.own += delta
    add(s.live_bytes_by, KV, delta)


def _perform_kv_use(sut: Any, request: int, stream: int) -> Fence:
    f = sut.ep.launch(sut.ref(stream), [], [])
    sut.kv.use(kv_name(request), f)
    return f


@action(role="KvPageStore",
        params={"request": Domain("an open request", lambda s, c: _open_requests(s)[c.integer(0, len(_open_requests(s)) - 1)],
                                  lambda s: bool(_open_requests(s))),
                "stream": Domain("a stream", lambda s, c: list(s.streams)[c.integer(0, len(s.streams) - 1)],
                                 lambda s: len(s.streams) > 0)},
        perform=_perform_kv_use, invariants=("S4",), weight=2)
def kv_use(s: SysState, request: int, stream: int) -> Any:
    """Submit device work using a request's KV on ``stream``; the store records the fence.

    Returns the fence.  The request's pages are not freed before it is done.
    """

    def then(_v: Fence) -> int:
        f = launch(s, stream)
        s.kv[request].fences.append(f)
        return f

    return outcomes(Returns("a Fence", lambda v: isinstance(v, Fence), then, lambda: Fence(stream, 0)), blame="S4")


@action(role="KvPageStore",
        params={"request": Domain("an open request", lambda s, c: _open_requests(s)[c.integer(0, len(_open_requests(s)) - 1)],
                                  lambda s: bool(_open_requests(s)))},
        perform=lambda sut, request: sut.kv.close(kv_name(request)), invariants=("S7", "S13", "S10"), weight=2)
def kv_close(s: SysState, request: int) -> Any:
    """Close a request: its pages' release is queued behind its fences.

    Returns None.  When the queue runs the release, the request's private
    pages are freed and refunded; prefix pages another request still maps
    stay (and stay charged) until the last request mapping them has been
    released too (S13).
    """
    q = s.kv[request]

    def then(_v: Any) -> None:
        close_request(s, request)

    return outcomes(Returns("None (release queued)", lambda v: v is None, then, lambda: None), blame="S13",
                    touched=(request,))


def close_request(s: SysState, ref: int) -> None:
    """Drop a request: its release is queued behind the request's own fences."""
    q = s.kv[ref]
    q.state = "closed"
    s.live_objects -= 1
    e = new_entry(s, f"kv request {ref}", q.fences, q.creator, {}, 0, None, exact=False)
    e.on_run = lambda: release_request(s, ref)
    e.kv = ref
    enqueue(s, e)


def release_request(s: SysState, ref: int) -> None:
    """The queue runs a request's release: its private pages are freed and
    refunded; a shared prefix page goes (and is refunded) only when the last
    request mapping it -- the origin or a sharer -- has been released (S13)."""
    q = s.kv[ref]
    q.state = "released"
    freed = 0
    if q.prefix_of is None:
        keep = max(q.sharers.values(), default=0)
        freed += q.own - keep
        q.own = keep
    else:
        freed += q.own
        q.own = 0
        origin = s.kv[q.prefix_of]
        del origin.sharers[ref]
        if origin.state == "released":
            keep = max(origin.sharers.values(), default=0)
            freed += origin.own - keep
            origin.own = keep
    if freed:
        add(s.live_bytes_by, KV, -freed)
        add(s.physical_by, KV, -freed)
        refund(s, KV, freed)


ACTIONS = [load_weight, set_hot, unload_weight, respond, kv_open, kv_grow, kv_use, kv_close]
