"""The planted breaks of ``memspec prove --self-test`` (:mod:`.proofs_selftest`, its face): the
:class:`Break` record and the builders of each break class -- encodings with a guard removed or a step
swapped, spec actions and kernels patched, executable checks weakened, caching policy breaks -- and the
heap and kernel detectors they name.  Every name here is a name of :mod:`.proofs_selftest`: import from there.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import z3

from memspec.invariants.formal import proofs_seed000 as E
from memspec.invariants.formal.proofs import Proof, on_ok, outcome, upd
from memspec.spec import kernels as K
from memspec.spec.core import Raises


@dataclass
class Break:
    name: str
    kind: str                       # "encoding" | "spec" | "kernel"
    invariant: str                  # the invariant it breaks
    detectors: tuple[str, ...]      # "prove", "agreement", "spec-check:<machine>"
    proof: Callable[[], Proof] | None = None          # encoding breaks: the broken proof
    patch: Callable[[], Iterator[None]] | None = None  # spec/kernel breaks: a context manager


@contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def _proof(inv: str) -> Proof:
    return next(p for p in E.PROOFS + E.MORE_PROOFS if p.id == inv)


def _guard_removed(inv: str) -> Callable[[], Proof]:
    """The proof with its guarded action replaced by the unguarded variant."""
    def build() -> Proof:
        p = _proof(inv)
        acts = [replace(p.unguarded, spec=a.spec) if a.name == p.unguarded.name else a for a in p.actions]
        return replace(p, actions=acts)
    return build


def _swap(inv: str, action: str, step: Callable[[Any, Any], Any]) -> Callable[[], Proof]:
    def build() -> Proof:
        p = _proof(inv)
        return replace(p, actions=[replace(a, step=step) if a.name == action else a for a in p.actions])
    return build


# -- encoding breaks that are not "the guard removed" -------------------------

def _s10_alloc_no_context(s: Any, a: Any) -> Any:
    """The queue machine's allocate (S4's, which S10 is proved on) that does not record the context
    it was made in (so nothing pins it)."""
    out, s2 = E._q_alloc(s, a)
    return out, s2.set(actx=s.actx)


def _s1_drop_through_installed(s: Any, a: Any) -> Any:
    """The queue machine's drop (S4's, which S1 is proved on) that records the mechanism installed now,
    not the object's creator, as the one its queued release runs through."""
    out, s2 = E._q_drop(s, a)
    return out, s2.set(fmech=z3.If(out == E.OK, upd(s.fmech, a.x, s.inst), s.fmech))


def _s8_commit_keeps_open_grant(s: Any, a: Any) -> Any:
    """commit turns the grant into a lease but the open-grant total keeps its bytes."""
    b = E.at(s.gb, a.g)
    out = outcome((E.at(s.gst, a.g) != E.G_OPEN, "InvalidRequest"),
                  (z3.Not(K.can_commit(E._ledger(s), b, a.actual)), "GrantDenied"))
    s1 = E._with_ledger(s, K.commit_grant(E._ledger(s), b, a.actual), gst=upd(s.gst, a.g, E.G_COMMITTED),
                        PG=E.prefix_change(s.PG, a.g, -b), cb=E._hadd(s.cb, E.SESSION_H, a.actual),
                        lsb=E._hadd(s.lsb, E.SESSION_H, a.actual))  # og not decremented
    return on_ok(out, s, E._item_new(s1, E.SESSION_H, E.K_LEASE, E.I_LEASE, a.actual))


def _s11_refund_ghost_stale(s: Any, a: Any) -> Any:
    b, h = E.at(s.ib, a.x), E.at(s.ih, a.x)
    out = outcome((E.at(s.ist, a.x) != E.I_LEASE, "InvalidRequest"))
    return on_ok(out, s, E._refund(s, h, b, lsb=E._hadd(s.lsb, h, -b), ret=b))  # the lease item (ghost) not updated


def _s15_claim_keeps_held(s: Any, a: Any) -> Any:
    out = outcome((E.at(s.tstate, a.t) != E.T_GRANTED, "InvalidTicket"))
    h = E.at(s.held, a.t)
    return on_ok(out, s, s.set(tstate=upd(s.tstate, a.t, E.T_CLAIMED), sumgr=s.sumgr + h, ret=h))


# -- spec-action breaks ----------------------------------------------------------

def _spec_patch(module_name: str, attr: str, make: Callable[[Any], Any]) -> Callable[[], Iterator[None]]:
    @contextmanager
    def cm() -> Iterator[None]:
        import importlib

        mod = importlib.import_module(module_name)
        with _patched(mod, attr, make(getattr(mod, attr))):
            yield
    return cm


def _poll_regardless(_orig: Any) -> Any:
    from memspec.spec import ep

    def run_done(s: Any, pending: Any, done: Any) -> int:
        for (_seq, fences), flag in zip(pending, done):
            if flag:
                for f in fences:
                    ep.learn_done(s, f)
        s.in_poll = True
        try:
            n = 0
            for seq, _f in pending:
                if seq in s.queue:
                    ep.run_entry(s, s.queue[seq])
                    n += 1
            return n
        finally:
            s.in_poll = False
    return run_done


def _drop_frees(orig: Any) -> Any:
    from memspec.spec import ep

    def drop_owned(s: Any, o: Any, fences: Any, *, exact: bool = True) -> None:
        orig(s, o, fences, exact=exact)
        ep.run_entry(s, s.queue[max(s.queue)])
    return drop_owned


def _eager_shared_free(_orig: Any) -> Any:
    def maybe_free(s: Any, h: Any) -> int:
        if h.released and not h.freed:
            h.freed = True
            s.shared_bytes -= h.size
            return h.size
        return 0
    return maybe_free


def _identity_reissued(orig: Any) -> Any:
    """create's witness identity is handed out again (the counter steps back): the twin of S14's
    guard on the identity side -- the queue machine takes an object's id for its identity, so only
    the executable check on the walk (duplicate identities) sees it."""
    def witness_identity(state: Any, creator: str = "spec") -> Any:
        ident = orig(state, creator)
        state.w_next_identity -= 1
        return ident
    return witness_identity


def _uncharged_growth(_orig: Any) -> Any:
    from memspec.spec.state import add

    def grow_commit(s: Any, q: Any, delta: int) -> None:
        add(s.physical_by, "kv", delta)
        q.own += delta
        add(s.live_bytes_by, "kv", delta)
    return grow_commit


# -- kernel breaks ------------------------------------------------------------------

def _kernel(attr: str, fn: Callable[..., Any]) -> Callable[[], Iterator[None]]:
    @contextmanager
    def cm() -> Iterator[None]:
        with _patched(K, attr, fn):
            yield
    return cm


def _grant_from_charged(l: Any, n: Any) -> Any:
    return K.Ledger(l.capacity, l.free, l.granted + n, l.charged - n)


def _refund_to_granted(l: Any, n: Any) -> Any:
    return K.Ledger(l.capacity, l.free, l.granted + n, l.charged - n)


def _can_grant_unchecked(l: Any, n: Any) -> Any:
    return n > 0


def _return_grant_twice(l: Any, n: Any) -> Any:
    return K.Ledger(l.capacity, l.free + 2 * n, l.granted - n, l.charged - n)


def _cancel_keeps_grant(l: Any, n: Any) -> Any:
    return K.Ledger(l.capacity, l.free + n, l.granted, l.charged)


def _round_up_short(n: Any, page: Any) -> Any:
    return K.floordiv(n, page) * page


# -- breaks of what "proved" rests on (issue 33): the engine's hypotheses, a vacuous invariant, an
#    error branch, a weakened executable check, a weakened kernel ---------------------------------

@contextmanager
def _contradictory_helper() -> Iterator[None]:
    """The engine's hypothesis builder (every consecution's ``Inv /\\ Lemmas /\\ Pre``) with one
    contradictory helper fact conjoined: every goal then holds vacuously."""
    from memspec.invariants.formal import proofs as P

    orig = P._hyp

    def hyp(p: Any, s: Any, o: Any, act: Any, a: Any, lemmas: bool = True) -> Any:
        h = orig(p, s, o, act, a, lemmas)
        x = z3.Int("helper_x")
        return z3.And(h, x > 0, x < 0)   # "a helper fact" no state satisfies

    with _patched(P, "_hyp", hyp):
        yield


def _contradictory_lemma(inv: str) -> Callable[[], Proof]:
    """The proof with a helper lemma that contradicts its own invariant (``Not(Inv)`` at the object)
    conjoined to whatever lemmas it has: every consecution's hypotheses are then unsat.  Caught by the
    satisfiability of each action's ``Inv /\\ Lemmas /\\ Pre`` (``hyp:<action>``) and, where Z3 leaves
    that to a concrete witness (prefix-sum rows), by the lemma not being derived (the row is
    conditional, not proved)."""
    def build() -> Proof:
        p = _proof(inv)
        old = p.lemmas

        def lemmas(s: Any, o: Any, a: Any) -> Any:
            bad = z3.Not(p.inv(s, o))
            return bad if old is None else z3.And(old(s, o, a), bad)
        return replace(p, lemmas=lemmas, lemma_doc="a contradictory helper")
    return build


def _vacuous_named(inv: str) -> Callable[[], Proof]:
    """The proof with the rule it is named for replaced by a tautology over its state (and no step
    property): ``Inv => Named`` holds and every check passes, saying nothing.  Caught by
    ``named:not-trivial`` (Named must be falsifiable)."""
    def build() -> Proof:
        p = _proof(inv)

        def named(s: Any, o: Any) -> Any:
            x = getattr(s, next(iter(p.fields)))   # any field, any sort: x == x
            return x == x
        return replace(p, named=named, step_prop=None)
    return build


def _vacuous(inv: str) -> Callable[[], Proof]:
    """The proof with its inductive invariant made vacuous (``Or(Inv, True)``): every check passes."""
    def build() -> Proof:
        p = _proof(inv)
        return replace(p, inv=lambda s, o, _i=p.inv: z3.Or(_i(s, o), True))
    return build


def _error_branch_mutates(machine: str, action: str, error_name: str,
                          mutate: Callable[[Any, dict[str, Any]], None]) -> Callable[[], Iterator[None]]:
    """A bug on an error branch, for any action of any machine: every ``Raises`` branch of ``action``
    whose error is ``error_name`` (or a subclass) still changes the state (``mutate(state, args)``) while
    the step reports the refusal.  Caught by the transition agreement, which compares each sampled
    branch's post-state (error branches included) with the encoding's."""
    @contextmanager
    def cm() -> Iterator[None]:
        import dataclasses
        import importlib

        m = {"system": ("memspec.spec.system", "SYSTEM"),
             "mechanism": ("memspec.spec.mechanism", "MECHANISM")}[machine]
        mach = getattr(importlib.import_module(m[0]), m[1])
        orig_actions = mach.actions
        act = next(a for a in orig_actions if a.name == action)

        def step(s: Any, **kw: Any) -> Any:
            outs = act.step(s, **kw)

            def then(err: Any, _b: Any = None) -> Any:
                mutate(s, kw)
                return None

            bs = tuple(dataclasses.replace(b, then=then)
                       if isinstance(b, Raises) and any(c.__name__ == error_name for c in b.error.__mro__)
                       else b for b in outs.branches)
            return dataclasses.replace(outs, branches=bs)

        new = [dataclasses.replace(a, step=step) if a is act else a for a in orig_actions]
        setter = (lambda v: object.__setattr__(mach, "actions", v)) if _frozen(mach) else \
            (lambda v: setattr(mach, "actions", v))
        setter(new)
        try:
            yield
        finally:
            setter(orig_actions)
    return cm


def _grow_page_more(s: Any, kw: dict[str, Any]) -> None:
    q = s.kv.get(kw["growth"][0])
    if q is not None:
        q.own += s.page


def _refused_reserve_grants(s: Any, _kw: dict[str, Any]) -> None:
    s.free -= s.page
    s.granted += s.page


#: spec kv_grow: a refused growth (GrantDenied) still commits a page more to the request (a bug on an
#: error branch: the step reports a refusal but changes the state)
_grow_refusal_grows = _error_branch_mutates("system", "kv_grow", "GrantDenied", _grow_page_more)


def _frozen(obj: Any) -> bool:
    import dataclasses

    return dataclasses.is_dataclass(obj) and getattr(type(obj), "__dataclass_params__").frozen


def _exec_weakened(inv: str, make: Callable[[Any], Any]) -> Callable[[], Iterator[None]]:
    """The executable invariant ``inv`` (``memspec.spec.invariants``) with a conjunct dropped: its
    ``check`` and ``full_check`` replaced by ``make(SI)`` (a ``_Levels``, built from the module), the
    module attribute and :data:`BY_ID` patched for the duration of the break."""
    @contextmanager
    def cm() -> Iterator[None]:
        import dataclasses

        from memspec.spec import invariants as SI

        old = SI.BY_ID[inv]
        lv = make(SI)
        new = dataclasses.replace(old, check=lv, full_check=lv, levels=lv.levels)
        with _patched(SI, inv, new):
            SI.BY_ID[inv] = new
            try:
                yield
            finally:
                SI.BY_ID[inv] = old
    return cm


def _s8_no_granted(SI: Any) -> Any:
    """executable S8 with its first conjunct dropped (granted = open grants + ticket holdings)."""
    def weak(s: Any) -> Any:
        for h, n in s.charged_by.items():
            own = s.live_bytes_by.get(h, 0) + s.queued_bytes_by.get(h, 0) + s.lease_bytes.get(h, 0)
            if n != own:
                return f"{h} is charged {n} but its live and queued footprints and leases come to {own}"
        return None
    return SI._sys(weak)


#: kept for callers of the former name: the S8 break's context manager
_s8_exec_weakened = _exec_weakened("S8", _s8_no_granted)


def _s11_no_holder_sum(SI: Any) -> Any:
    """executable S11 (system level) without "the holders' charges sum to the ledger's charged"."""
    def weak(s: Any) -> Any:
        if not K.ledger_ok(K.Ledger(s.capacity, s.free, s.granted, s.charged)):
            return f"ledger broken: capacity {s.capacity} != free {s.free} + granted {s.granted} + charged {s.charged}"
        for h, n in s.charged_by.items():
            if n < 0:
                return f"{h} has a negative charge {n}"
        return None
    return SI._both(SI._s11_mech, weak)


def _s5_no_physical_model(SI: Any) -> Any:
    """executable S5 (mechanism level) without "the physical bytes reported are the pages installed"."""
    def weak(s: Any) -> Any:
        if s.absent_answered:
            return f"an absent capability was answered with an object ({s.absent_answered} time(s))"
        return None
    return SI._both(weak, SI._s5_sys)


def _s13_no_readonly(SI: Any) -> Any:
    """executable S13 (mechanism level) without "no write through a read-only mapping succeeded"."""
    def weak(s: Any) -> Any:
        live = 0
        for h in s.handles.values():
            if h.freed and (not h.released or h.mappings):
                return f"handle {h.ref} freed with {h.mappings} mapping(s), released={h.released}"
            if not h.freed:
                live += h.size
        if live != s.shared_bytes:
            return f"unfreed handles hold {live} bytes; counted {s.shared_bytes}"
        return None
    return SI._both(weak, SI._s13_sys)


def _s12_nothing(SI: Any) -> Any:
    """executable S12 with its one conjunct dropped (no moved address recorded): it accepts everything."""
    return SI._sys(lambda s: None)


def _exec_weakened_breaks() -> list[Break]:
    """Issue 33's "a weakened executable check": each caught by the agreement's comparison on perturbed
    states (:mod:`memspec.invariants.formal.agreement_perturb`), as ``memspec prove`` runs it."""
    return [
        Break("S8 spec: the executable S8 drops its granted = open + held conjunct", "spec", "S8",
              ("agreement",), patch=_s8_exec_weakened),
        Break("S11 spec: the executable S11 drops its holders' charges = charged conjunct", "spec", "S11",
              ("agreement",), patch=_exec_weakened("S11", _s11_no_holder_sum)),
        Break("S5 spec: the executable S5 drops its physical = installed pages conjunct", "spec", "S5",
              ("agreement",), patch=_exec_weakened("S5", _s5_no_physical_model)),
        Break("S13 spec: the executable S13 drops its read-only writes conjunct", "spec", "S13",
              ("agreement",), patch=_exec_weakened("S13", _s13_no_readonly)),
        Break("S12 spec: the executable S12 drops its one conjunct (accepts everything)", "spec", "S12",
              ("agreement",), patch=_exec_weakened("S12", _s12_nothing)),
    ]


def _footprint_one_page_more(orig: Any) -> Any:
    def aligned_footprint(requested: Any, alignment: Any, page: Any) -> Any:
        return orig(requested, alignment, page) + K.ite(alignment > page, page, 0)
    return aligned_footprint


def uncaught() -> list[Break]:
    """Breaks of issue 33 that no detector catches yet (not in :func:`catalog`, so ``--self-test``
    still means "every planted break killed").  None now: the weakened executable checks are
    :func:`_exec_weakened_breaks`, caught by the comparison on perturbed states."""
    return []


# -- caching breaks (spec/caching policy) -------------------------------------------

def _no_merge(_orig: Any) -> Any:
    return lambda seg, i: i


def _release_nothing(orig: Any) -> Any:
    def release_cached(st: Any) -> int:
        for s in list(st.issued):
            st.completed[s] = st.issued[s]
        return 0
    return release_cached


def _merge_loses_next(orig: Any) -> Any:
    def merge_around(seg: Any, i: int) -> int:
        b = seg.blocks[i]
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == b.state:
            seg.blocks.pop(i + 1)  # merged away without adding its size: a gap follows
        return orig(seg, i)
    return merge_around


def _any_pool(orig: Any) -> Any:
    def candidates(st: Any, small: bool, stream: int, r: int) -> Any:
        return orig(st, not small, stream, r) + orig(st, small, stream, r)
    return candidates


@contextmanager
def _reserved_short() -> Iterator[None]:
    from memspec.spec.caching.state import CachingState

    orig = CachingState.reserved

    def reserved(self: Any, small: Any = None) -> int:
        n = orig(self, small)
        segs = [s for s in self.segments if small is None or s.small == small]
        return n - (segs[-1].size if segs else 0)

    with _patched(CachingState, "reserved", reserved):
        yield


# -- caching heap-encoding breaks (invariants/formal/proofs_caching_heap) -----------------

#: C invariant -> the goal of its unguarded action's consecution that the guard protects
HEAP_GOALS = {"C1": ("reserved",), "C2": ("C2:pair",), "C3": ("C3",), "C4": ("C4",), "C5": ("step:C5",),
              "C6": ("step:C6",), "C7": ("step:C7",), "C8": ("step:C8",), "C9": ("step:C9",)}



def _guard_removed_refutes(inv: str, act_name: str, guard: str, words: str, only: Any,
                           knob: str | None = None) -> str | None:
    """The heap action ``act_name`` proves its goals ``only`` and, with
    ``guard`` removed, does not: the catch naming ``inv``, else None."""
    from memspec.invariants.formal import proofs_caching_heap as H

    good = next(a for a in H.actions() if a.name == act_name)
    if any(r not in ("proved", "framed") for _n, r, _t in H.consecution(good, 60000, only=only)):
        return None  # fires unbroken: proves nothing
    # a well-formed heap the unguarded action breaks falsifies its consecution outright (the bounded search
    # answers in under a second where the consecution can spend minutes reaching unknown: C5 took 232 s)
    # (``knob``: the row of :data:`proofs_caching_heap.KNOB_UNGUARDED`, else :data:`~.UNGUARDED`'s of ``inv``)
    refuted, trace = H.refute(inv, knob=knob)
    if refuted:
        return (f"prove (caching heap): {act_name} without '{words}': refuted on a well-formed heap, "
                f"{trace.splitlines()[-1].strip(' =>')}")
    bad = next(a for a in H.actions(frozenset({guard})) if a.name == act_name)
    for name, r, _t in H.consecution(bad, 60000, only=only):
        if r not in ("proved", "framed"):
            return f"prove (caching heap): {act_name} without '{words}': {name} {r} ({inv})"
    return None

def detect_heap(inv: str) -> str | None:
    """The invariant's guarded action proves its goal and the same action with
    the guard removed (:data:`proofs_caching_heap.UNGUARDED`) does not."""
    from memspec.invariants.formal import proofs_caching_heap as H

    act_name, guard, words = H.UNGUARDED[inv]
    only = HEAP_GOALS[inv]
    return _guard_removed_refutes(inv, act_name, guard, words, only)


def detect_caching_kernels() -> str | None:
    from memspec.invariants.formal.proofs_caching_heap import kernel_boundary_agreement

    bad = kernel_boundary_agreement()
    return f"prove (caching kernels at thresholds): {bad[0]} (C5)" if bad else None


def _strict_seed_split(orig: Any) -> Any:
    def should_split(remaining: int, size: int, small: bool, seed_preset: bool = False, expandable: bool = False,
                     max_split_size: int = 0) -> bool:
        if seed_preset:
            return remaining > (512 if small else 2 * 1024 * 1024)
        return orig(remaining, size, small, seed_preset, expandable, max_split_size)
    return should_split


def _whole_run(orig: Any) -> Any:
    """The heap's ``map_len`` with C8's guard removed: the whole unmapped block, not the pages lacking."""
    def map_len(s: Any, q: Any, guards: frozenset = frozenset()) -> Any:
        return orig(s, q, guards | {"map-lacking"})
    return map_len


def _unmap_nothing(_orig: Any) -> Any:
    def unmap(st: Any, seg: Any, i: int) -> int:
        return 0
    return unmap


def _last_arena_first(_orig: Any) -> Any:
    """_find_expandable with the arenas in descending address order (the first fit picks the last arena)."""
    from memspec.spec.caching import policy as Pol

    def find(st: Any, small: bool, stream: int, r: int) -> Any:
        arenas = sorted((g for g in st.segments if g.expandable and g.small == small and g.stream == stream),
                        key=lambda g: -(g.base if g.base is not None else -(1 << 62)))
        for g in arenas:
            for i, b in enumerate(g.blocks):
                if b.state != Pol.UNMAPPED:
                    continue
                j = i - 1 if i > 0 and Pol._allocatable(g.blocks[i - 1]) else i
                got, k = 0, j
                while got < r and k < len(g.blocks) and (g.blocks[k].state == Pol.UNMAPPED
                                                         or Pol._allocatable(g.blocks[k])):
                    got += g.blocks[k].size
                    k += 1
                if got >= r:
                    return g, j
        page = st.policy.page(small)
        size = -(-int(st.policy.capacity * st.policy.arena) // page) * page
        return Pol._new_segment(st, size, small, stream, True, page), 0
    return find


def _release_keeps_pages(_orig: Any) -> Any:
    """_release_cached that waits for every event and releases whole free segments but unmaps no page."""
    from memspec.spec.caching import policy as Pol

    def release(st: Any) -> int:
        for s in list(st.issued):
            st.completed[s] = st.issued[s]
        Pol._process_events(st)
        return sum(Pol._release_segment(st, g) for g in list(st.segments)
                   if not g.expandable and len(g.blocks) == 1 and g.blocks[0].state == Pol.FREE)
    return release
