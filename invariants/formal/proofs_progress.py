"""P1 progress: a KV request that fits after releases can always be admitted.

Issue 13 (deliverable 8), after the onnx-genai TLA+ specs the design comes
from (*a KV admission can always drain*), stated as liveness-as-safety on
seed 000's protocol: *When memory is tight, all it can send is: pressure
ticket: try to free 1 GB, priority = ..., deadline = ...* and *ModelResidency:
two cold weights can free 700 MB*.  The admission is step 3 of the KV growth
transaction, *the Governor provides a provisional grant for the growth
amount*.

Claim: in every state meeting S15's inductive invariant (so every reachable
one), a request of ``n > 0`` bytes with ``n <= free + cold`` (``cold``: the
bytes of ModelResidency's cold resident weights, all charged) is admitted by
this sequence, each step enabled and taking its ok branch:

1. ``n <= free``: the grant of ``n`` at once;
2. otherwise ``issue_ticket(n - free)``; ModelResidency answers it
   (``respond``) releasing its cold weights; the ticket is then granted and
   ``claim`` hands its bytes to the requester as a grant, which returns them
   (``cancel``) so the grant of ``n`` fits.

Checked two ways:

* **Z3**, for an arbitrary state: the steps are S15's encoded actions
  (:mod:`memspec.invariants.formal.proofs_seed000`, the same terms its induction and
  agreement use) and the ledger kernels; the negation is unsat.  Two sanity
  checks keep it from being vacuous: the hypotheses are satisfiable with
  releases needed, and dropping ``cold`` from the bound (``n <= free + cold +
  1``) is refuted (a state where the sequence fails).
* **On the executable spec**, by a walk: at reachable SYSTEM states the
  sequence is run on a copy of the state through the spec's own actions
  (``issue_ticket``, ``respond``, ``claim``, ``cancel``, ``reserve``) for the
  largest request that fits, ``n = free + cold``; each must offer its ok
  branch.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass, field
from typing import Any

import z3

from memspec.invariants.formal.proofs import OK, St, fresh
from memspec.invariants.formal.solving import Query, check
from memspec.spec import kernels as K

ID, TITLE = "P1", "progress"
GUARD = "the request fits in free + the cold weights' bytes (n <= free + cold)"


@dataclass
class ProgressResult:
    proved: bool = False
    detail: str = ""
    vacuous: bool = True
    refuted_without_fit: bool = False
    refutation: str = ""
    samples: int = 0            # spec states checked
    needing_release: int = 0    # of which the request needed releases (n > free)
    counterexamples: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _sequence(s: St, n: Any, cold: Any) -> tuple[list[Any], Any]:
    """The obligations (each step enabled and ok) and the admission's guard."""
    from memspec.invariants.formal import proofs_seed000 as E

    p = E.S15
    t = s.nt
    need = n - s.free
    issue, respond, claim = p.action("issue_ticket"), p.action("respond"), p.action("claim")
    a1 = St(t=t, n=need, dl=z3.IntVal(0))
    o1, s1 = issue.step(s, a1)
    # ModelResidency answers with its cold bytes (S15's figure; S6's victims are not needed here)
    a2 = St(t=t, holder=z3.IntVal(E.H_WEIGHTS), nv=z3.IntVal(0), v1=z3.IntVal(0), v2=z3.IntVal(0), r=cold,
            refunded=z3.IntVal(0))
    o2, s2 = respond.step(s1, a2)
    a3 = St(t=t)
    o3, s3 = claim.step(s2, a3)
    led = K.cancel_grant(K.Ledger(s3.cap, s3.free, s3.granted, s3.charged), s3.ret)
    released = [issue.pre(s, a1), o1 == OK, respond.pre(s1, a2), o2 == OK, claim.pre(s2, a3), o3 == OK,
                K.can_grant(led, n)]
    direct = K.can_grant(E._ledger(s), n)
    return released, z3.If(n <= s.free, direct, z3.And(*released))


def prove_progress() -> ProgressResult:
    from memspec.invariants.formal import proofs_seed000 as E

    res = ProgressResult()
    t0 = time.perf_counter()
    s = fresh(E.S15.fields, "p1")
    n, cold = z3.Ints("n cold")
    hyp = z3.And(E.S15.inv(s, s.nt), 0 <= cold, cold <= s.charged, n > 0)
    _obl, admitted = _sequence(s, n, cold)
    r, m = check(z3.And(hyp, n <= s.free + cold, z3.Not(admitted)), budget_ms=20000)
    res.proved = r == z3.unsat
    res.detail = "proved" if res.proved else f"{r}: " + " ".join(str(m).split())[:400]
    sol = Query(20000)   # rlimit units (never the clock): satisfiable hypotheses, not vacuous
    sol.add(hyp, n > s.free, n <= s.free + cold)
    res.vacuous = sol.check() != z3.sat
    r2, m2 = check(z3.And(hyp, n <= s.free + cold + 1, z3.Not(admitted)), budget_ms=20000)
    res.refuted_without_fit = r2 == z3.sat
    if m2 is not None:
        res.refutation = (f"n={m2.eval(n)}, free={m2.eval(s.free)}, cold={m2.eval(cold)}, "
                          f"charged={m2.eval(s.charged)}: the sequence does not admit")
    res.seconds = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------
# The executable spec, by a walk
# --------------------------------------------------------------------------

def _cold(s: Any) -> int:
    return sum(w.pages for w in s.weights.values() if w.resident and not w.hot) * s.page


def admit_after_releases(s: Any) -> str | None:
    """Run the sequence on a copy of ``s`` for ``n = free + cold``; ``None``
    when every step offered its ok branch, else what refused."""
    from memspec.spec.api import Grant, TicketState
    from memspec.spec.core import Returns
    from memspec.spec.ep import known_flags, queue_snapshot
    from memspec.spec.governor import WEIGHTS
    from memspec.spec.selfcheck import drive
    from memspec.spec.state import Seen
    from memspec.spec.system import SYSTEM

    c = copy.deepcopy(s)
    cold = _cold(c)
    n = c.free + cold
    if n <= 0:
        return None
    try:
        if n > c.free:
            t = drive(SYSTEM, c, "issue_ticket", request=(n - c.free, 0, 0))
            pending = queue_snapshot(c)
            answer = Seen(None, {"done": known_flags(c, pending), "released": cold, "state": TicketState.GRANTED,
                                 "held": cold})
            drive(SYSTEM, c, "respond", answer=(t, WEIGHTS, False), pending=pending, value=answer)
            held = c.tickets[t].held
            g = drive(SYSTEM, c, "claim", ticket=t, value=Grant(c.next_ref, "session", held))
            drive(SYSTEM, c, "cancel", grant=g, value=held)
        outs = SYSTEM.action("reserve").step(c, nbytes=n)
        if not any(isinstance(b, Returns) for b in outs.branches):
            return f"reserve({n}) refused: {outs.describe()}"
    except AssertionError as e:
        return f"n={n} (free {s.free}, cold {cold}): {e}"
    return None


def check_on_spec(samples: int, seed: int) -> ProgressResult:
    """Walk SYSTEM (all its actions, from the ticket walk's init: two cold
    weights loaded) and check :func:`admit_after_releases` at ``samples``
    visited states."""
    from memspec.spec.core import RandomChooser
    from memspec.spec.selfcheck import draw_branch, follow, pick_action, usable
    from memspec.invariants.formal.agreement_adapters import _sys_too_big, _tickets_init
    from memspec.spec.system import SYSTEM

    res = ProgressResult()
    t0 = time.perf_counter()
    rng = random.Random(seed)
    chooser = RandomChooser(rng)
    state, steps = _tickets_init(), 0
    for _ in range(samples * 20):
        if res.samples >= samples:
            break
        if steps >= 40 or _sys_too_big(state):
            state, steps = _tickets_init(), 0
        steps += 1
        act = pick_action([a for a in SYSTEM.actions if usable(a, state)], rng)
        _args, _outs, branch = draw_branch(act, state, chooser)
        if branch is None:
            continue
        follow(branch)
        res.samples += 1
        if _cold(state) > 0:
            res.needing_release += 1
        why = admit_after_releases(state)
        if why is not None:
            res.counterexamples.append(why)
    res.seconds = time.perf_counter() - t0
    return res


def record(samples: int, seed: int) -> dict[str, Any]:
    """The P1 row of ``memspec prove`` (the same keys as the invariants' rows)."""
    from memspec.invariants.formal.proofs_catalog import declared

    z = prove_progress()
    w = check_on_spec(samples, seed)
    why = []
    if not z.proved:
        why.append(f"Z3: {z.detail[:300]}")
    if z.vacuous:
        why.append("Z3: the hypotheses are unsatisfiable with releases needed (vacuous)")
    if not z.refuted_without_fit:
        why.append("Z3: the bound is not tight (n <= free + cold + 1 still admits)")
    if w.needing_release == 0:
        why.append("walk: no state needed a release")
    if w.counterexamples:
        why.append(f"walk: {len(w.counterexamples)} state(s) not admitted, e.g. {w.counterexamples[0][:300]}")
    steps = ["system:issue_ticket", "system:respond", "system:claim", "system:cancel", "system:reserve"]
    return {
        "id": ID, "title": TITLE, "proved": not why, "status": "proved" if z.proved else "FAILED",
        "bounded": None, "assumed": [],
        "declared_actions": [a for a in steps if a in set(declared("S15")) | set(declared("S11"))],
        "encoded_actions": steps,
        "invariant_agreement": {"samples": w.samples, "disagreements": len(w.counterexamples)},
        "transition_agreement": {"walk:admitted after releases": {"ok": w.needing_release - sum(
            1 for c in w.counterexamples)}, "walk:admitted at once": {"ok": w.samples - w.needing_release}},
        "unguarded": {"guard": GUARD, "refuted": z.refuted_without_fit, "named_invariant_violated": z.refuted_without_fit,
                      "trace": z.refutation},
        "checks": [{"name": "z3:admitted", "ok": z.proved, "seconds": round(z.seconds, 3), "detail": z.detail}],
        "_why": why, "_details": {"inv": [], "mismatch": [], "unsampled": []},
    }
