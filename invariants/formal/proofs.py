"""Z3 engine for the spec's inductive proofs (issue 5).

An invariant's proof is a small transition system (:class:`Proof`): typed
state fields (unbounded ``Int``s, ``Bool``s, and arrays ``Int -> Int`` /
``Int -> Bool`` indexed by object id, so every object not named by an action
is framed unchanged by construction), an initial predicate, the actions that
touch the invariant, and the invariant itself, stated for one arbitrary object
``o`` (a free variable: proving ``Inv(s, o) /\\ Step => Inv(s', o)`` for a free
``o`` proves it for every object).

Each action is a *total* function ``(state, args) -> (outcome, next state)``
written with :mod:`memspec.spec.kernels` (``ite``/``both``/ledger kernels), so
the same arithmetic the executable spec runs is what Z3 reasons about.
Nondeterminism the spec allows (an OOM, the actual footprint) is an argument.

Checks, each ``proved`` or a counterexample:

* initiation: ``Init => Inv``;
* consecution, per action: ``Inv /\\ Lemmas /\\ Pre /\\ Step => Inv' /\\ StepProp``
  (``StepProp``: a property of the transition itself, e.g. S5 "a successful
  commit changes committed bytes by exactly the page-rounded range");
* safety, where the invariant is a strengthening: ``Inv => Safety``;
* necessity of the guard: the *unguarded* variant of one action (its guard
  removed) must be refuted: bounded model checking from ``Init`` finds the
  shortest trace to a violation, printed over concrete values.

``Lemmas`` (facts about ghost sums, e.g. "each non-negative term of a sum is
at most the sum") are never assumed: before a consecution uses one as a
hypothesis, ``Inv /\\ Pre => Lemmas`` is itself checked (check
``derive:<action>``).  A ghost sum is made checkable by a prefix-sum ghost
(:func:`prefix_sum`): dense object ids ``0 <= i < n``, ``P[0] = 0``,
``P[i+1] = P[i] + c(i)``, ``P`` monotone, the sum ``= P[n]`` -- all part of
the invariant, so proved inductive like the rest.  A lemma that does not
follow from the invariant is reported in ``assumed`` and the proof is
*conditional*, never "proved".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import z3

from memspec.invariants.formal import solving
from memspec.invariants.formal.solving import Query
from memspec.invariants.formal.z3native import Unsupported, from_z3
from memspec.invariants.formal.z3fast import And, Implies, Not, Or
from memspec.spec import kernels as K
from memspec.spec.errors import ALL_ERRORS

INT, BOOL, ARR, BARR, ARR2B, ARR2 = "int", "bool", "arr", "barr", "arr2b", "arr2"

#: outcome codes: 0 ok, 1 pending (a queued release whose fences are not done), then each error class
#: ("MemspecError": the spec only says *some* error of the contract, e.g. an injected failure)
OUTCOMES: tuple[str, ...] = ("ok", "pending") + tuple(ALL_ERRORS) + ("MemspecError",)
CODE: dict[str, int] = {name: i for i, name in enumerate(OUTCOMES)}
OK = CODE["ok"]
PENDING = CODE["pending"]


_SORTS: dict[str, z3.SortRef] = {}


def _sort(kind: str) -> z3.SortRef:
    """The Z3 sort of a field kind (built once: building every sort per field
    dominated :func:`fresh` in ``memspec prove``'s profile)."""
    if not _SORTS:
        _SORTS.update({
            INT: z3.IntSort(),
            BOOL: z3.BoolSort(),
            ARR: z3.ArraySort(z3.IntSort(), z3.IntSort()),
            BARR: z3.ArraySort(z3.IntSort(), z3.BoolSort()),
            ARR2B: z3.ArraySort(z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.BoolSort())),
            ARR2: z3.ArraySort(z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.IntSort())),
        })
    return _SORTS[kind]


class St(dict):
    """A state (or an argument record): field name -> Z3 term or Python value."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def set(self, **kw: Any) -> "St":
        out = St(self)
        out.update(kw)
        return out


def fresh(fields: dict[str, str], tag: str) -> St:
    return St({f: z3.Const(f"{f}@{tag}", _sort(k)) for f, k in fields.items()})


def merge(cond: Any, a: St, b: St) -> St:
    """Field-wise ``a if cond else b`` (a field that is one term in both stays that term: the
    relations, and the bounded model checks that stack them, stay small)."""
    same = lambda x, y: x is y or (z3.is_expr(x) and z3.is_expr(y) and x.eq(y))  # noqa: E731
    return St({f: a[f] if same(a[f], b[f]) else z3.If(cond, a[f], b[f]) for f in a})


def upd(arr: Any, i: Any, v: Any) -> Any:
    return z3.Store(arr, i, v)


def at(arr: Any, i: Any) -> Any:
    """``arr[i]``.  Built by the C API where ``arr`` is an array term and ``i``
    an integer (a Python ``int`` or an ``Int`` term): z3py's ``Select`` checks
    and re-casts both on every call, and building the invariants and
    relations of ``memspec prove`` is mostly array reads."""
    if isinstance(i, int) and not isinstance(i, bool):
        i = iv(i)
    if (isinstance(arr, (z3.ArrayRef, z3.QuantifierRef)) and isinstance(i, z3.ArithRef)
            and arr.ctx is i.ctx):
        # Z3 shares equal terms, so an AST's address names the term (the memo keeps both alive)
        key = (arr.ast.value, i.ast.value)
        got = _SELECTS.get(key)
        if got is None:
            if len(_SELECTS) >= SELECTS_CAP:
                _SELECTS.clear()
            if i.sort_kind() != z3.Z3_INT_SORT or arr.sort_kind() != z3.Z3_ARRAY_SORT:
                return z3.Select(arr, i)
            ctx = arr.ctx
            got = _SELECTS[key] = (z3.z3._to_expr_ref(z3.Z3_mk_select(ctx.ref(), arr.as_ast(), i.as_ast()), ctx),
                                   arr, i)
        return got[0]
    return z3.Select(arr, i)


#: at most this many memoized reads (a cache: clearing it changes no term)
SELECTS_CAP = 400_000
#: ``arr[i]`` terms built so far, by the addresses of ``arr`` and ``i`` (with both, so neither is freed)
_SELECTS: dict[tuple[int, int], tuple[Any, Any, Any]] = {}


def outcome(*pairs: tuple[Any, str], default: str = "ok") -> Any:
    """First ``(condition, outcome name)`` whose condition holds, else ``default``."""
    out: Any = z3.IntVal(CODE[default])
    for cond, name in reversed(pairs):
        out = z3.If(cond, z3.IntVal(CODE[name]), out)
    return out


def on_ok(out: Any, s: St, s_ok: St) -> tuple[Any, St]:
    """The transition: ``s_ok`` when the outcome is ok, ``s`` (unchanged) otherwise."""
    return out, merge(out == OK, s_ok, s)


@dataclass
class Act:
    """One action of an encoding: ``step(s, a) -> (outcome code, next state)``."""

    name: str
    params: dict[str, str]
    step: Callable[[St, St], tuple[Any, St]]
    pre: Callable[[St, St], Any] = lambda s, a: True
    objs: tuple[str, ...] = ()  # params naming objects: Inv is assumed at them too
    #: the spec actions this encodes, ``"level:name"`` (checked against the spec's action tables)
    spec: tuple[str, ...] = ()


@dataclass
class Proof:
    id: str
    title: str
    quote: str
    fields: dict[str, str]
    init: Callable[[St], Any]
    inv: Callable[[St, Any], Any]
    actions: list[Act]
    unguarded: Act
    guard: str  # the guard the unguarded variant removes, in words
    step_prop: Callable[[str, St, St, Any, St, Any], Any] | None = None
    safety: Callable[[St, Any], Any] | None = None
    lemmas: Callable[[St, Any, St], Any] | None = None
    lemma_doc: str = "lemmas"  # what the lemmas say, in words (reported if not derived)
    #: further objects the invariant is instantiated at, ``inst(s, o, a) -> [terms]`` (sound: Inv
    #: is proved for a free object, so it holds at every term, e.g. at the context of allocation o)
    inst: Callable[[St, Any, St], list[Any]] | None = None
    #: the invariant the proof is named for, without its auxiliary and ghost conjuncts: an
    #: unguarded variant must break this (or the step property / safety), not any conjunct
    named: Callable[[St, Any], Any] | None = None
    bmc_depth: int = 4
    bounded: str = ""  # which part is bounded, if any, and why
    #: extra closed formulas that must be valid, proved alongside: (name, formula)
    lemmas_proved: list[tuple[str, Any]] = field(default_factory=list)
    #: ``INT`` fields that count dense ids (the bounds of prefix-sum ghosts): invariant agreement
    #: builds the invariant once per tuple of their concrete values, so each ghost is unrolled
    #: (:func:`prefix_sum`) and a concrete state decides it by substitution, with no solver call
    counts: tuple[str, ...] = ()
    #: the solver budget of each check, in milliseconds of CPU on an unloaded core (a Z3 resource
    #: limit, :class:`~.solving.Query`, so the answer does not depend on load); a check past it is
    #: "unknown": not proved.  A machine whose largest check needs seconds of CPU gets more room.
    timeout_ms: int = 20000

    def action(self, name: str) -> Act:
        for a in self.actions:
            if a.name == name:
                return a
        raise KeyError(name)


@dataclass
class CheckResult:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class ProofResult:
    id: str
    title: str
    checks: list[CheckResult] = field(default_factory=list)
    unguarded_refuted: bool = False
    unguarded_trace: str = ""
    unguarded_seconds: float = 0.0
    bounded: str = ""
    #: hypotheses used but not proved (each makes the proof conditional)
    assumed: list[str] = field(default_factory=list)
    #: what the unguarded variant's counterexample breaks, read from its model: "named invariant",
    #: "step property" or "safety" ("" when not refuted); computed, never copied from ``refuted``
    unguarded_violates: str = ""
    #: per action, the outcome branches a model of its hypotheses (``Inv /\ Pre``) took (check
    #: ``hyp:<action>``); actions whose hypotheses Z3 neither satisfied nor refuted within budget
    hyp_branches: dict[str, list[str]] = field(default_factory=dict)
    hyp_unknown: list[str] = field(default_factory=list)

    @property
    def named_invariant_violated(self) -> bool:
        """The counterexample breaks the rule the row is named for (its named invariant or its step
        property), not only an auxiliary or ghost conjunct."""
        return self.unguarded_refuted and self.unguarded_violates in ("named invariant", "step property")

    @property
    def holds(self) -> bool:
        """Every check passed (possibly under an assumption)."""
        return all(c.ok for c in self.checks)

    @property
    def proved(self) -> bool:
        """Every check passed and nothing was assumed."""
        return self.holds and not self.assumed

    @property
    def status(self) -> str:
        return "proved" if self.proved else ("conditional" if self.holds else "FAILED")

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.checks)


def _model_str(m: z3.ModelRef, s: St, objs: list[tuple[str, Any]]) -> str:
    parts = []
    for f, v in s.items():
        if not z3.is_expr(v):
            continue
        if z3.is_array(v):
            for oname, o in objs:
                parts.append(f"{f}[{oname}]={m.eval(at(v, o), model_completion=True)}")
        else:
            parts.append(f"{f}={m.eval(v, model_completion=True)}")
    return ", ".join(parts)


def _args(act: Act, tag: str) -> St:
    return fresh(act.params, tag)


def _hyp(p: Proof, s: St, o: Any, act: Act | None, a: St | None, lemmas: bool = True) -> Any:
    hs = [p.inv(s, o)]
    if act is not None and a is not None:
        hs += [p.inv(s, a[x]) for x in act.objs]
        hs.append(act.pre(s, a))
    if p.inst is not None:
        args = a if a is not None else St()
        hs += [p.inv(s, x) for x in p.inst(s, o, args)]
    if lemmas and p.lemmas is not None:
        hs.append(p.lemmas(s, o, a if a is not None else St()))
        if act is not None and a is not None:
            hs += [p.lemmas(s, a[x], a) for x in act.objs]
    return And(*[z3.BoolVal(h) if isinstance(h, bool) else h for h in hs])


def prefix_sum(P: Any, n: Any, c: Callable[[Any], Any]) -> Any:
    """A checked prefix-sum ghost over dense ids ``0 <= i < n``: ``P[0] = 0``,
    ``P[i+1] = P[i] + c(i)``, ``P`` monotone on ``[0, n]`` (so ``c(i) <= P[n]``
    for every ``i < n`` whose ``c(i) >= 0``).  ``P[n]`` is then the sum of
    ``c`` over the ids, with no lemma assumed: these facts are part of the
    invariant and proved inductive with it."""
    if isinstance(n, int) or z3.is_int_value(n):
        # a concrete state (invariant agreement): the same facts unrolled, no quantifier left to decide
        k = n if isinstance(n, int) else n.as_long()
        if k < 0:
            return z3.BoolVal(False)
        return And(at(P, 0) == 0, *[at(P, i + 1) == at(P, i) + c(i) for i in range(k)],
                      *[at(P, i) <= at(P, i + 1) for i in range(k)])
    i, j = z3.Ints("ps_i ps_j")
    return And(
        n >= 0, at(P, 0) == 0,
        z3.ForAll([i], Implies(And(0 <= i, i < n), at(P, i + 1) == at(P, i) + c(i))),
        z3.ForAll([i, j], Implies(And(0 <= i, i <= j, j <= n), at(P, i) <= at(P, j))),
    )


def prefix_append(P: Any, n: Any, v: Any) -> Any:
    """``P`` after appending id ``n`` with contribution ``v``."""
    return upd(P, n + 1, at(P, n) + v)


def prefix_change(P: Any, x: Any, delta: Any) -> Any:
    """``P`` after id ``x``'s contribution changed by ``delta``: every prefix past ``x`` moves."""
    j = z3.Int("pc_j")
    return z3.Lambda([j], z3.If(j > x, at(P, j) + delta, at(P, j)))


def prefix_count(P2: Any, n: Any, k: Any, c: Callable[[Any, Any], Any]) -> Any:
    """A keyed prefix-sum ghost, stated at one key ``k`` (the invariant's free
    object, so it holds at every key): ``P2[k]`` is a :func:`prefix_sum` of
    ``c(k, i)`` over the dense ids ``0 <= i < n`` (e.g. how many live
    allocations context ``k`` has: ``P2[k][n]``)."""
    return prefix_sum(at(P2, k), n, lambda i: c(k, i))


def count_append(P2: Any, n: Any, key: Any) -> Any:
    """``P2`` after appending id ``n``, counted once under ``key``."""
    k = z3.Int("ca_k")
    return z3.Lambda([k], prefix_append(at(P2, k), n, z3.If(k == key, 1, 0)))


def count_change(P2: Any, x: Any, key: Any, delta: Any) -> Any:
    """``P2`` after id ``x``'s count under ``key`` changed by ``delta``."""
    k = z3.Int("cc_k")
    return z3.Lambda([k], prefix_change(at(P2, k), x, z3.If(k == key, delta, 0)))


def prefix_values(contribs: list[int]) -> tuple[int, dict[int, int]]:
    """The concrete prefix-sum ghost of a list of contributions (for projections)."""
    out, acc = {0: 0}, 0
    for i, c in enumerate(contribs):
        acc += c
        out[i + 1] = acc
    return (0, out)


def _check(name: str, claim_negation: Callable[[], Any], timeout_ms: int,
           fail: Callable[[Any, Any], str], proved: str = "proved") -> CheckResult:
    """The check ``name``: its claim holds when ``claim_negation()`` (built here, inside the time taken)
    is unsat within ``timeout_ms``; otherwise its detail is ``fail(answer, model or None)``."""
    t0 = time.perf_counter()
    r, m = solving.check(claim_negation(), budget_ms=timeout_ms)
    return CheckResult(name, r == z3.unsat, time.perf_counter() - t0, proved if r == z3.unsat else fail(r, m))


def _model_fail(s: St, o: Any) -> Callable[[Any, Any], str]:
    """A failed check's detail: the answer and, where Z3 gave a model, the state at object ``o``."""
    return lambda r, m: f"{r}: " + (_model_str(m, s, [("o", o)]) if m else "")


#: budget of each satisfiability check of an action's hypotheses (``hyp:<action>``), in ms of CPU on a
#: quiet core (:class:`~.solving.Query`): an easy model, or an unsat core, comes within it; a
#: quantified ledger machine's often does not (then "unknown": its branches need a concrete witness
#: from the agreement walk, :func:`hyp_witness`)
HYP_MS = 100


def _aligned_footprint_fact(page: int) -> Any:
    """:func:`kernels.aligned_footprint` at ``page`` is the least multiple of the page that holds the
    request and the alignment beyond the page: no page more, none less (its docstring contract leaves
    an alignment above the page unconstrained above)."""
    n, al, k = z3.Ints("kf_n kf_al kf_k")
    r = K.aligned_footprint(n, al, page)
    need = n + K.maximum(al - page, 0)
    return Implies(And(n > 0, al > 0),
                   And(r >= need, r < need + page, r == K.floordiv(r, page) * page))


def _round_up_fact(page: int) -> Any:
    """:func:`kernels.round_up` at ``page`` is the least multiple of the page that holds ``n`` (its
    docstring contract): no page more, none less."""
    n = z3.Int("kr_n")
    r = K.round_up(n, page)
    return Implies(n >= 0, And(r >= n, r < n + page, r == K.floordiv(r, page) * page))


_PAGES = (4096, 65536, 2 * 1024 * 1024)

#: facts about the spec's kernels that a row's charges rest on, proved with the row (``kernel:<name>``);
#: built when checked, so a kernel patched in this process is the one proved
KERNEL_FACTS: dict[str, tuple[tuple[str, Callable[[], Any]], ...]] = {
    row: tuple((f"aligned_footprint@{pg}", (lambda pg=pg: _aligned_footprint_fact(pg))) for pg in _PAGES)
    for row in ("S2", "S8")
}
#: S9's growth is charged in pages: round_up is the page rounding its commits rest on
KERNEL_FACTS["S9"] = tuple((f"round_up@{pg}", (lambda pg=pg: _round_up_fact(pg))) for pg in _PAGES)


def named_of(p: Proof) -> Callable[[St, Any], Any]:
    """The invariant the row is named for (the whole invariant where no narrower one is given)."""
    return p.named if p.named is not None else p.inv


def check_named(p: Proof, s: St, o: Any) -> list[CheckResult]:
    """``Inv => Named`` valid, and the named rule is not the constant True: ``Named`` is falsifiable,
    or (a rule that is a step property, S7) some action's step property is."""
    named = named_of(p)
    out = [_check("named:implied", lambda: And(p.inv(s, o), Not(named(s, o))), p.timeout_ms,
                  lambda r, m: f"{r}: the inductive invariant does not imply the named one"
                  + (f": {_model_str(m, s, [('o', o)])}" if m is not None else ""), proved="Inv => Named proved")]
    t0 = time.perf_counter()
    sol = Query(p.timeout_ms)   # no model taken: one made in the main context moves the refutation's search
    sol.add(Not(named(s, o)))
    r = sol.check()
    detail = "Named is falsifiable" if r == z3.sat else ""
    ok = r == z3.sat
    if not ok and p.step_prop is not None:
        s2 = fresh(p.fields, "np2")   # any next state and outcome: the property, not the step
        out_ = z3.Int("np_out")
        for act in p.actions:  # the rule is a step property: one of them must be falsifiable
            a = _args(act, "np")
            sp = p.step_prop(act.name, s, a, out_, s2, o)
            sp = z3.BoolVal(sp) if isinstance(sp, bool) else sp
            sol = Query(p.timeout_ms)
            sol.add(Not(sp))
            if sol.check() == z3.sat:
                ok, detail = True, f"Named is True; the step property of {act.name} is falsifiable"
                break
    out.append(CheckResult("named:not-trivial", ok, time.perf_counter() - t0,
                           detail or f"VACUOUS ({r}): the named invariant (and every step property) is valid, "
                                     "so 'proved' would say nothing"))
    return out


def check_hypotheses(p: Proof, s: St, o: Any, res: ProofResult) -> None:
    """Each action's hypotheses (``Inv /\\ Lemmas /\\ Inst /\\ Pre``, what its consecution assumes) are
    satisfiable: unsat is a contradiction that would make every goal of that action proved (check
    ``hyp:<action>`` fails); sat records the branch its model takes; unknown (within :data:`HYP_MS`)
    leaves the action in ``hyp_unknown`` for a concrete witness (the agreement walk)."""
    for act in p.actions:
        t0 = time.perf_counter()
        if p.counts:
            # prefix-sum ghosts over a symbolic count: Z3's model search does not finish on these
            # (every action of S8/S11 answered unknown, 17 s CPU in all); the agreement walk's
            # concrete states are the witnesses (:func:`hyp_witness`)
            res.hyp_unknown.append(act.name)
            res.checks.append(CheckResult(f"hyp:{act.name}", True, 0.0, "quantified ghosts: a concrete witness "
                                                                       "from the agreement walk is needed"))
            continue
        a = _args(act, "a")
        out, _s2 = act.step(s, a)
        r, m = solving.check(_hyp(p, s, o, act, a), budget_ms=HYP_MS)
        if r == z3.sat:
            b = _outcome_in(m, out)
            res.hyp_branches[act.name] = [b] if b is not None else []
            detail = f"satisfiable (a model takes {res.hyp_branches[act.name]})"
        elif r == z3.unsat:
            detail = "CONTRADICTORY: Inv /\\ Pre is unsat, so every goal of this action holds vacuously"
        else:
            res.hyp_unknown.append(act.name)
            detail = f"unknown within {HYP_MS} ms: a concrete witness is needed"
        res.checks.append(CheckResult(f"hyp:{act.name}", r != z3.unsat, time.perf_counter() - t0, detail))


def hyp_formula(p: Proof, act: Act, s: St, a: St, o: Any) -> Any:
    """``Inv /\\ Lemmas /\\ Inst /\\ Pre`` of ``act`` at object ``o`` (what its consecution assumes)."""
    return _hyp(p, s, o, act, a)


def prove(p: Proof) -> ProofResult:
    """Initiation, ``Inv => Named``, satisfiable hypotheses, consecution per action, safety; then
    refute the unguarded variant."""
    res = ProofResult(p.id, p.title, bounded=p.bounded)
    o = z3.Int("o")
    s = fresh(p.fields, "s")

    res.checks.append(_check("init", lambda: And(p.init(s), Not(p.inv(s, o))), 20000, _model_fail(s, o)))
    res.checks += check_named(p, s, o)
    check_hypotheses(p, s, o, res)

    for act in p.actions + ([] if p.safety is None else [None]):  # type: ignore[list-item]
        if p.lemmas is None:
            break
        # the lemmas a consecution (or safety) uses follow from Inv and Pre
        t0 = time.perf_counter()
        a = _args(act, "a") if act is not None else St()
        lem = [p.lemmas(s, o, a)] + ([p.lemmas(s, a[x], a) for x in act.objs] if act is not None else [])
        r, m = solving.check(And(_hyp(p, s, o, act, a if act is not None else None, lemmas=False),
                                 Not(And(*lem))), budget_ms=p.timeout_ms)
        where = act.name if act is not None else "safety"
        if r != z3.unsat:
            res.assumed.append(f"{p.lemma_doc} (at {where}: not derived from the invariant, {r})")
        res.checks.append(CheckResult(f"derive:{where}", True, time.perf_counter() - t0,
                                      "derived" if r == z3.unsat else f"ASSUMED ({r})"))

    for act in p.actions:
        t0 = time.perf_counter()
        a = _args(act, "a")
        out, s2 = act.step(s, a)
        goal = [p.inv(s2, o)]
        if p.step_prop is not None:
            goal.append(p.step_prop(act.name, s, a, out, s2, o))
        r, m = solving.check(And(_hyp(p, s, o, act, a), Not(And(*goal))), budget_ms=p.timeout_ms)
        detail = "proved"
        if r != z3.unsat:
            detail = f"{r}"
            if m is not None:
                objs = [("o", o)] + [(x, a[x]) for x in act.objs]
                detail += f": {act.name}(" + ", ".join(f"{k}={m.eval(v, model_completion=True)}" for k, v in a.items()) + ") "
                detail += f"-> {_outcome_in(m, out)} from {_model_str(m, s, objs)}"
        res.checks.append(CheckResult(f"step:{act.name}", r == z3.unsat, time.perf_counter() - t0, detail))

    plain = lambda r, m: f"{r}: {m}"   # noqa: E731
    res.checks += [_check(f"kernel:{name}", lambda build=build: Not(build()), p.timeout_ms, plain)
                   for name, build in KERNEL_FACTS.get(p.id, ())]
    res.checks += [_check(f"lemma:{name}", lambda f=formula: Not(f), 20000, plain) for name, formula in p.lemmas_proved]
    if p.safety is not None:
        res.checks.append(_check("safety", lambda: And(_hyp(p, s, o, None, None), Not(p.safety(s, o))), 20000,
                                 _model_fail(s, o)))

    t0 = time.perf_counter()
    ok, trace, violates = refute_unguarded_ex(p)
    res.unguarded_refuted, res.unguarded_trace, res.unguarded_violates = ok, trace, violates
    res.unguarded_seconds = time.perf_counter() - t0
    return res


_BRANCHES: dict[Any, list[str]] = {}


def branches(p: Proof, act: Act, timeout_ms: int = 10000) -> list[str]:
    """The outcome branches ``act`` can take from any state meeting its
    precondition (each found by a model; complete when the last query
    answers unsat).  Without the invariant as hypothesis: an over-approximation,
    so every branch listed must be sampled by the agreement walk.  Computed
    once per (step, pre, params, fields, budget): the key holds the functions
    themselves, so a planted break (another step) is never answered from it."""
    key = (act.step, act.pre, tuple(act.params.items()), tuple(p.fields.items()), timeout_ms)
    return list(memo(_BRANCHES, key, lambda: _branches(p, act, timeout_ms)))


def memo(cache: dict[Any, Any], key: Any, build: Callable[[], Any]) -> Any:
    """``cache[key]``, built by ``build()`` the first time."""
    got = cache.get(key)
    if got is None:
        got = cache[key] = build()
    return got


def _branches(p: Proof, act: Act, timeout_ms: int) -> list[str]:
    s = fresh(p.fields, "b")
    a = _args(act, "b")
    out, _s2 = act.step(s, a)
    sol = Query(timeout_ms)
    pre = act.pre(s, a)
    sol.add(z3.BoolVal(True) if isinstance(pre, bool) else pre)
    found: list[str] = []
    while sol.check() == z3.sat:
        name = _outcome_in(sol.model(), out)
        if name is None:
            break
        found.append(name)
        sol.add(out != CODE[name])
    return sorted(found)


def _outcome_in(m: z3.ModelRef, out: Any) -> str | None:
    """The outcome an action's outcome term ``out`` takes in model ``m`` (``None``: not a constant)."""
    v = m.eval(out, model_completion=True)
    return OUTCOMES[v.as_long()] if z3.is_int_value(v) else None


def _val(m: z3.ModelRef, v: Any) -> Any:
    """``v``'s value in ``m``: a Python ``int`` or ``bool`` where it is a literal (:func:`.z3native.from_z3`)."""
    x = m.eval(v, model_completion=True)
    try:
        return from_z3(x)
    except Unsupported:
        return x


def refute_unguarded(p: Proof, actions: list[Act] | None = None) -> tuple[bool, str]:
    """Bounded model checking from ``Init`` with the unguarded action in place
    of its guarded one: the shortest trace (depth <= ``p.bmc_depth``) that
    breaks the invariant, a step property or safety.  ``(True, trace)`` when
    refuted, ``(False, reason)`` when no violation was found."""
    ok, trace, _what = refute_unguarded_ex(p, actions)
    return ok, trace


def refute_unguarded_ex(p: Proof, actions: list[Act] | None = None) -> tuple[bool, str, str]:
    """:func:`refute_unguarded` and what the counterexample breaks, evaluated in its model: "named
    invariant" (``Named`` false at the last state), else "step property" (the row's step property
    false at some step), else "safety"; "" when not refuted."""
    acts = [p.unguarded if a.name == p.unguarded.name else a for a in (actions or p.actions)]
    params: dict[str, str] = {}
    for a in acts:
        params.update(a.params)
    o = z3.Int("o")
    s0 = fresh(p.fields, "0")
    # in the main context, incremental, seeds 0-3 on the one solver: at depth 4 S4's counterexample
    # (quantified fences) comes from the state the shallower depths left (1.8 s); a fresh solver or a
    # context of its own answered unknown under 8 seeds.  So this search depends on the process's terms:
    # ``prove`` runs each row in a fresh process, and the tests of a refutation are ``fresh_process``.
    sol = Query(20000, isolated=False)
    sol.add(p.init(s0))
    states, sels, argss, outs = [s0], [], [], []
    undecided: list[int] = []
    for k in range(1, p.bmc_depth + 1):
        s = states[-1]
        sel = z3.Int(f"act@{k}")
        a = fresh(params, str(k))
        sol.add(sel >= 0, sel < len(acts))
        nxt: St | None = None
        out: Any = None
        bad_here = []
        for i, act in enumerate(acts):
            oi, si = act.step(s, a)
            sol.add(Implies(sel == i, act.pre(s, a)))
            nxt = si if nxt is None else merge(sel == i, si, nxt)
            out = oi if out is None else z3.If(sel == i, oi, out)
            if p.step_prop is not None:
                bad_here.append(And(sel == i, Not(p.step_prop(act.name, s, a, oi, si, o))))
        assert nxt is not None
        states.append(nxt)
        sels.append(sel)
        argss.append(a)
        outs.append(out)
        named = named_of(p)
        bad = [Not(named(nxt, o))] + bad_here
        if p.safety is not None:
            bad.append(Not(p.safety(nxt, o)))
        sol.push()
        sol.add(Or(*bad))
        sol.set("random_seed", 0)
        r = sol.check()
        for seed in range(1, 4 if r == z3.unknown else 1):
            sol.set("random_seed", seed)
            r = sol.check()
            if r != z3.unknown:
                break
        if r == z3.sat:
            m = sol.model()
            lines = []
            for j in range(k):
                act = acts[_val(m, sels[j])]
                args = ", ".join(f"{n}={_val(m, argss[j][n])}" for n in act.params)
                tag = " [unguarded]" if act is p.unguarded else ""
                lines.append(f"  {j + 1}. {act.name}({args}) -> {OUTCOMES[_val(m, outs[j])]}{tag}")
            if not z3.is_true(m.eval(named(states[-1], o), model_completion=True)):
                what = "named invariant"
            elif bad_here and not z3.is_true(m.eval(Not(Or(*bad_here)), model_completion=True)):
                what = "step property"
            else:
                what = "safety"
            lines.append(f"  => {what} broken at o={_val(m, o)}: " + _model_str(m, states[-1], [("o", o)]))
            return True, "\n".join(lines), what
        undecided += [k] if r == z3.unknown else []
        sol.pop()
    return False, f"no violation up to depth {p.bmc_depth}" + (
        f" (depth {', '.join(map(str, undecided))} undecided: Z3 answered unknown)" if undecided else ""), ""


# --------------------------------------------------------------------------
# Concrete values as Z3 literals (the agreement checks substitute them into encoded terms)
# --------------------------------------------------------------------------

_IV: dict[int, Any] = {}
_BV = {True: None, False: None}


def iv(v: int) -> Any:
    """``z3.IntVal(v)``, cached (building Z3 literals dominates concrete evaluation)."""
    t = _IV.get(v)
    if t is None:
        if len(_IV) > 200000:
            _IV.clear()
        t = _IV[v] = z3.IntVal(v)
    return t


def bv(v: Any) -> Any:
    t = _BV.get(bool(v))
    if t is None:
        t = _BV[bool(v)] = z3.BoolVal(bool(v))
    return t


_CONCRETE: dict[Any, Any] = {}


def native_value(kind: str, value: Any) -> Any:
    """A field's concrete value (the form :func:`concrete` takes) as an array ``(default, {index:
    value})``, nested for the two-level kinds (the form of :mod:`.z3native` too); a scalar as it is."""
    if kind == ARR2B:   # {index: set of true indices}
        return ((False, {}), {i: (False, {j: True for j in t}) for i, t in value.items()})
    if kind == ARR2:    # {index: (default, {index: value})}, rows absent: all 0
        return ((0, {}), dict(value))
    return value


def _frozen(x: Any) -> Any:
    return (_frozen(x[0]), tuple(sorted((i, _frozen(v)) for i, v in x[1].items()))) if type(x) is tuple else x


def _array(x: Any, lit: Callable[[Any], Any]) -> Any:
    """A :func:`native_value` as a Z3 term: a constant array of its default, then its stores in index order."""
    if type(x) is not tuple:
        return lit(x)
    arr = z3.K(z3.IntSort(), _array(x[0], lit))
    for i, v in sorted(x[1].items()):
        arr = z3.Store(arr, iv(i), _array(v, lit))
    return arr


def concrete(kind: str, value: Any) -> Any:
    """A Python value as a Z3 literal of the field's kind: arrays from
    ``(default, {index: value})``, ``ARR2B`` from ``{index: set of true indices}``."""
    if kind == INT:
        return iv(value)
    if kind == BOOL:
        return bv(value)
    arr = native_value(kind, value)
    key = (kind, value[0], tuple(sorted(value[1].items()))) if kind in (ARR, BARR) else (kind, _frozen(arr))
    t = _CONCRETE.get(key)
    if t is None:
        if len(_CONCRETE) > 50000:
            _CONCRETE.clear()
        t = _CONCRETE[key] = _array(arr, iv if kind in (ARR, ARR2) else bv)
    return t


__all__ = [
    "Act", "Proof", "ProofResult", "CheckResult", "St", "prove", "refute_unguarded", "refute_unguarded_ex",
    "check_named", "check_hypotheses", "hyp_formula", "named_of", "branches", "OUTCOMES", "CODE", "OK", "PENDING", "INT", "BOOL", "ARR", "BARR",
    "merge", "upd", "at", "outcome", "on_ok", "fresh", "K", "prefix_sum", "prefix_append", "prefix_change",
    "prefix_count", "count_append", "count_change", "ARR2", "prefix_values",
]
