"""Encoding agreement: the Z3 relation and the executable spec are one machine.

For each encoded action with a counterpart in the executable spec, random
*reachable* spec states are produced by walking the spec's own machine from
its initial state (arguments drawn by the spec's own domains, a random
permitted branch followed, its witness value fed back: the steps of
:mod:`memspec.spec.selfcheck`; the walks: :mod:`~memspec.invariants.formal.walks`).  Before each step
the spec state is projected onto the encoding's fields (objects renumbered
densely); the encoded action is evaluated on those concrete values by
:mod:`~memspec.invariants.formal.z3native` (the term as straight-line Python; its
first evaluation and every ``CROSS_CHECK_EVERY``-th are also evaluated by
Z3 and must give the same value) or, for a term with a quantifier left
(e.g. "some page of the range is committed"), by ``z3.substitute`` +
``z3.simplify`` and a solver call; and the result must agree with the
spec's step:

* the encoding's outcome is one the spec permits (``ok`` for a ``Returns``
  branch, the error class for a ``Raises`` branch);
* when it is the branch the walk follows, the encoding's next state equals
  the projection of the spec's state after that branch, field by field and
  object by object (and the value returned, where the encoding has one).

Ghost fields of an encoding (who freed an object, the generation owner map)
are not compared.

Where a row compares the invariants (the encoded one on the projection, the
executable one on the spec state), it also compares them on perturbed copies
of the state, mostly unreachable (:mod:`~memspec.invariants.formal.agreement_perturb`):
an executable check that holds where the named encoding fails is weaker than
its encoding (a conjunct dropped), which reachable states alone never show.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import z3

from memspec.invariants.formal.proofs import (
    ARR, ARR2, ARR2B, BARR, INT, OUTCOMES, Act, Proof, St, _args, at, concrete, fresh, iv, memo,
    native_value,
)
from memspec.invariants.formal import z3native as native
from memspec.invariants.formal.solving import Query
from memspec.invariants.formal.walks import RESTART
from memspec.spec.core import RandomChooser, Returns
from memspec.spec.selfcheck import draw_branch, follow, pick_action, usable


def outcome_name(branch: Any) -> str:
    return "ok" if isinstance(branch, Returns) else branch.error.__name__


# --------------------------------------------------------------------------
# Concrete evaluation of an encoded action
# --------------------------------------------------------------------------

Key = tuple[str, Any]


def substitute(t: Any, *pairs: tuple[Any, Any]) -> Any:
    """``z3.substitute`` without z3py's per-pair sort checks (the pairs are
    built here from the encoding's own fields, so the sorts match); those
    checks cost more than the substitution itself on every sample."""
    n = len(pairs)
    src, dst = (z3.Ast * n)(), (z3.Ast * n)()
    for i, (f, v) in enumerate(pairs):
        src[i], dst[i] = f.as_ast(), v.as_ast()
    return z3.z3._to_expr_ref(z3.Z3_substitute(t.ctx.ref(), t.as_ast(), n, src, dst), t.ctx)


def instantiate(e: Any, indices: list[int], memo: dict[int, Any] | None = None) -> Any:
    """``e`` with each single-variable ``ForAll``/``Exists`` replaced by the
    conjunction/disjunction of its body at ``indices`` (lambdas are first
    beta-reduced by ``simplify``).  Exact on concrete states whose arrays
    store only at indices in ``indices`` when the body reads arrays only at
    the bound variable: every other index reads the defaults, as does the
    one index of ``indices`` never stored (``-1``).  Opt-in per adapter
    (``Adapter.finite``); spares a solver call per sample."""
    seen: dict[int, tuple[Any, Any]] = {} if memo is None else memo  # id -> (term, result): the term kept alive

    def go(x: Any) -> Any:
        k = x.get_id()
        if k in seen:
            return seen[k][1]
        y = x
        if z3.is_quantifier(x):
            if not x.is_lambda() and x.num_vars() == 1:
                body = go(x.body())
                parts = [z3.substitute_vars(body, iv(i)) for i in indices]
                y = z3.And(*parts) if x.is_forall() else z3.Or(*parts)
        elif z3.is_app(x) and x.num_args() > 0:
            kids = x.children()
            new = [go(c) for c in kids]
            if any(a is not b for a, b in zip(new, kids)):
                y = x.decl()(*new)
        seen[k] = (x, y)
        return y
    return go(z3.simplify(e)) if z3.is_expr(e) else e


class Compiled:
    """An encoded action's relation over symbolic state, compiled once per
    (action, universe sizes), evaluated on concrete values."""

    def __init__(self, p: Proof, act: Act, nobj: int, npages: int, compare: tuple[str, ...],
                 finite: bool = False) -> None:
        self.p, self.act = p, act
        self.s = fresh(p.fields, "cs")
        self.a = _args(act, "ca")
        out, s2 = act.step(self.s, self.a)
        pre = act.pre(self.s, self.a)
        self.pre = z3.BoolVal(True) if isinstance(pre, bool) else pre
        memo: dict[int, Any] = {}
        fin = (lambda e: instantiate(e, list(range(nobj)) + [-1], memo)) if finite else (lambda e: e)
        out, self.pre = fin(out), fin(self.pre)
        self.keys: list[Key] = [("outcome", None)]
        exprs: list[Any] = [out]
        for key in compared_keys(p.fields, compare, nobj, npages):
            f, ix = key
            self.keys.append(key)
            exprs.append(s2[f] if ix is None else at(s2[f], ix) if isinstance(ix, int)
                         else at(at(s2[f], ix[0]), ix[1]))
        exprs = [exprs[0]] + [fin(e) for e in exprs[1:]]
        self.terms = [self.pre, *exprs]   # the precondition, the outcome, every compared value
        # the same terms evaluated by Python (:mod:`z3native`); None where a quantifier remained
        scalar = all(not z3.is_array(e) for e in exprs)
        self.prog = native.build(self.terms) if scalar else None
        self.packed = native.pack(self.terms) if scalar else None   # the same terms, for Z3 (at once)
        self._bools = [z3.is_bool(t) for t in self.terms]
        self._names = [(self.s[f].decl().name(), f, k) for f, k in p.fields.items()] + \
            [(self.a[n].decl().name(), n, k) for n, k in act.params.items()]

    def _env(self, state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
        n_state = len(self.p.fields)
        return {nm: native_value(k, (state if i < n_state else args)[f]) for i, (nm, f, k) in enumerate(self._names)}

    def _keyed(self, vals: tuple[Any, ...]) -> dict[Key, Any]:
        out = dict(zip(self.keys, vals[1:]))
        out[("pre", None)], out[("outcome", None)] = bool(vals[0]), OUTCOMES[vals[1]]
        return out

    def values(self, state: dict[str, Any], args: dict[str, Any]) -> dict[Key, Any]:
        """The encoding on concrete values: whether the action applies (``("pre", None)``), its outcome
        (the branch it takes) and every compared output -- by :mod:`z3native`, cross-checked with Z3 on a
        sample, or by Z3 (each term substituted and simplified; a solver call where a quantifier remained)."""
        def by_z3() -> dict[Key, Any]:
            subs = self._subs(state, args)
            if self.packed is None:   # an array-valued output
                return self._keyed(tuple(self._decide(substitute(e, *subs)) for e in self.terms))
            got = native.unpack(z3.simplify(substitute(self.packed, *subs)), len(self.terms), self.act.name)
            got = [x if isinstance(x, int) else self._decide(x) for x in got]
            return self._keyed(tuple(bool(x) if b else x for x, b in zip(got, self._bools)))

        return native.checked(self.prog, lambda: self._env(state, args), self._keyed, by_z3,
                              f"{self.act.name}'s step")

    def agrees(self, got: dict[Key, Any], allowed: set[str], expected: dict[Key, Any]) -> bool:
        """Whether the action applies, its outcome is one of ``allowed`` and every compared value of
        ``got`` (:meth:`values`) equals ``expected``'s."""
        return got[("pre", None)] and got[("outcome", None)] in allowed and \
            all(got[key] == expected[key] for key in self.keys[1:])

    @classmethod
    def _decide(cls, e: Any) -> Any:
        """A closed term's value: a literal after simplification, else (a quantifier remained) a Boolean
        decided by :meth:`_truth`, an integer once each outermost quantifier in it is decided so."""
        v = z3.simplify(e)
        if z3.is_bool(v):
            return cls._truth(v)
        qs: dict[int, Any] = {}

        def outermost(t: Any) -> None:
            if z3.is_quantifier(t):   # closed: a Boolean quantifier is decided, a lambda left as it is
                qs[t.get_id()] = None if t.is_lambda() else t
            elif t.get_id() not in qs:
                qs[t.get_id()] = None
                for c in t.children():
                    outermost(c)
        outermost(v)
        return native.from_z3(z3.simplify(z3.substitute(v, *[(q, z3.BoolVal(cls._truth(q))) for q in qs.values()
                                                             if q is not None])))

    def _subs(self, state: dict[str, Any], args: dict[str, Any]) -> list[tuple[Any, Any]]:
        return [(self.s[f], concrete(k, state[f])) for f, k in self.p.fields.items()] + \
            [(self.a[n], concrete(k, args[n])) for n, k in self.act.params.items()]

    @staticmethod
    def _truth(e: Any) -> bool:
        v = z3.simplify(e)
        if z3.is_true(v) or z3.is_false(v):
            return z3.is_true(v)
        sol = Query(5000, isolated=False)  # a quantifier remained: decide the closed formula
        sol.add(v)
        r = sol.check()
        if r == z3.unknown:
            # a universal formula (every stream's fences done) is decided by
            # its negation: an existential, which is quantifier-free for Z3
            neg = Query(5000, isolated=False)
            neg.add(z3.Not(v))
            rn = neg.check()
            if rn == z3.unknown:
                raise RuntimeError(f"could not decide {v}")
            return rn == z3.unsat
        return r == z3.sat


# --------------------------------------------------------------------------
# Adapters: a spec action <-> an encoded action
# --------------------------------------------------------------------------

@dataclass
class Adapter:
    """How one spec action maps onto one encoded action.

    ``project(spec_state, spec_args, taken) -> (enc_state, enc_args, universe)``
    or ``None`` to skip the sample (outside the encoding's scope); ``taken`` is
    the outcome the walk follows (it sets the encoding's choice arguments
    where the spec is nondeterministic);
    ``expected(spec_state_after, universe, value) -> {key: value}`` the
    compared fields after the branch (``value``: what the branch returned).
    """

    invariant: str
    action: str          # encoded action name
    spec_action: str
    project: Callable[[Any, dict[str, Any]], Any]
    expected: Callable[[Any, Any, Any], dict[Key, Any]]
    compare: tuple[str, ...]
    #: when > 0, the number of spec outcomes this action should be sampled on
    #: in equal shares: a sample whose outcome already has its share
    #: (``samples // balance``) is skipped, so a rarer outcome (a decommit that
    #: succeeds) is still reached; skips are bounded (5 x ``samples``)
    balance: int = 0
    #: spec actions that lead to this action's rarer outcomes (a commit before
    #: a decommit): the walk favours them too while this adapter needs samples
    helpers: tuple[str, ...] = ()
    #: further invariants whose proofs encode this action by the very same
    #: step (same ``step`` and ``pre`` functions, same fields): each sample is
    #: credited to them too, with their own invariant agreement (S7 and S10 share S4's machine, G1 and S6 S15's)
    also: tuple[str, ...] = ()
    #: concrete evaluation instantiates the encoding's quantifiers over the
    #: universe (see :func:`instantiate`; the projection must keep every
    #: array's stores at dense indices ``0 <= i < nobj``)
    finite: bool = False
    #: where one spec step stands for several encoded outcomes (the spec's ``expire``
    #: times out every due ticket; the encoding one ticket, an error when that one
    #: is not due): ``permit(value, enc_args) -> the encoded outcomes the accepted
    #: step permits``; the expected state is then the spec's state after the step
    permit: Callable[[Any, dict[str, Any]], set[str]] | None = None
    #: at most this many samples (and invariant-agreement states) for this adapter, when fewer than
    #: the run asks for: an encoding whose projection is costly (a whole ledger) keeps ``memspec prove``
    #: within its time budget; ``None``: the run's figures
    max_samples: int | None = None
    max_inv_samples: int | None = None
    #: the share of the walk's ``samples`` (and ``inv_samples``) this adapter
    #: needs; past it, a sample is still taken when the spec follows an
    #: outcome this adapter has seen fewer than ``RARE`` times (rare branches)
    weight: float = 1.0

    def keys(self) -> list[tuple[str, str, str]]:
        """``(row, encoded action, spec action)`` of every row a sample of this adapter is credited to:
        its own first, then those of ``also``."""
        return [(i, self.action, self.spec_action) for i in (self.invariant,) + self.also]


@dataclass
class AgreementReport:
    invariant: str
    action: str
    spec_action: str
    samples: int = 0
    skipped: int = 0
    seconds: float = 0.0
    mismatches: list[str] = field(default_factory=list)  # every disagreement (no cap)
    outcomes: dict[str, int] = field(default_factory=dict)  # spec outcome followed -> samples
    branches: dict[str, int] = field(default_factory=dict)  # encoding's outcome on agreeing samples -> samples
    inv_samples: int = 0                                    # states the invariants were compared on
    inv_disagreements: list[str] = field(default_factory=list)
    enough_at: int | None = None  # the walk's step at which the adapter had enough samples
    #: the executable invariant failed on a state the walk visited (checked at every state, not only
    #: where the encoded one is compared: a break that falsifies both alike is caught here)
    exec_violations: list[str] = field(default_factory=list)
    #: outcome branches of the encoded action on which a concrete sample satisfied the action's
    #: proof hypotheses (``Inv /\ Lemmas /\ Inst /\ Pre``, :func:`proofs.hyp_formula`): witnesses
    hyp_witnessed: dict[str, int] = field(default_factory=dict)
    #: samples on which the hypotheses were evaluated and did not hold (the encoded invariant holds
    #: on every reachable state, so one is a contradiction or a wrong lemma)
    hyp_refuted: list[str] = field(default_factory=list)
    #: invariant strength off the reachable states (:mod:`memspec.invariants.formal.agreement_perturb`):
    #: perturbed states compared, and those skipped (the projection or the check declined them)
    perturbed: int = 0
    perturb_skipped: int = 0
    #: perturbed states on which the executable invariant holds and the named encoding fails (the
    #: executable check is weaker than its encoding there): a disagreement (every one, no cap)
    exec_weaker: list[str] = field(default_factory=list)
    #: the same on a leaf of :data:`agreement_perturb.SHADOWED` (a record behind an aggregate): not counted
    shadowed: int = 0
    #: perturbed states on which the executable invariant fails and the whole encoding holds, by leaf
    #: pattern (a field the projection does not carry, or a rule the encoding does not state): a figure
    enc_weaker: dict[str, int] = field(default_factory=dict)
    #: perturbed states the executable invariant rejected; the state class the walk is on
    exec_rejected: int = 0
    level: str = ""


class Universe:
    """Dense renumbering of spec reference ids, per object kind."""

    def __init__(self) -> None:
        self.idx: dict[str, dict[int, int]] = {}
        self.pages = 1

    def add(self, kind: str, refs: Any) -> dict[int, int]:
        m = {ref: i for i, ref in enumerate(sorted(refs))}
        self.idx[kind] = m
        return m

    @property
    def nobj(self) -> int:
        return max([len(m) for m in self.idx.values()] + [1])


def arr(default: Any, items: dict[int, Any]) -> tuple[Any, dict[int, Any]]:
    return (default, items)


def compared_keys(fields: dict[str, str], compare: tuple[str, ...], nobj: int, npages: int) -> list[Key]:
    """The keys a comparison reads, in order: ``(field, None)`` of a scalar, ``(field, i)`` of an array
    at each object, ``(field, (i, j))`` of a two-level array (``j`` over the pages for ``ARR2B``, over the
    objects for ``ARR2``).  The compiled terms (:class:`Compiled`) and the projected values
    (:func:`flatten`) are both read at these keys."""
    out: list[Key] = []
    for f in compare:
        kind = fields[f]
        if kind in (ARR, BARR):
            out += [(f, i) for i in range(nobj)]
        elif kind in (ARR2B, ARR2):
            out += [(f, (i, j)) for i in range(nobj) for j in range(npages if kind == ARR2B else nobj)]
        else:
            out.append((f, None))
    return out


def flatten(state: dict[str, Any], fields: dict[str, str], compare: tuple[str, ...], u: Universe) -> dict[Key, Any]:
    """The compared values of an encoded state, by key (:func:`compared_keys`)."""
    out: dict[Key, Any] = {}
    for key in compared_keys(fields, compare, u.nobj, u.pages):
        f, ix = key
        kind, v = fields[f], state[f]
        if ix is None:
            out[key] = v
        elif kind in (ARR, BARR):
            out[key] = v[1].get(ix, v[0])
        elif kind == ARR2B:
            out[key] = ix[1] in v.get(ix[0], set())
        else:   # ARR2: rows absent are all 0
            d, items = v.get(ix[0], (0, {}))
            out[key] = items.get(ix[1], d)
    return out


def quantified_counts(p: Proof) -> tuple[str, ...]:
    """The ``INT`` fields of ``p`` that occur inside a quantifier of its
    invariant (the bounds ``n`` of prefix-sum ghosts, :func:`proofs.prefix_sum`),
    with the proof's declared ``counts``: with these concrete the ghosts unroll
    and the rest of a state is decided by substitution."""
    s = fresh(p.fields, "qc")
    by_id = {s[f].get_id(): f for f, k in p.fields.items() if k == INT}
    found: set[str] = set()
    seen: set[tuple[int, bool]] = set()

    def go(x: Any, inside: bool) -> None:
        k = (x.get_id(), inside)
        if k in seen:
            return
        seen.add(k)
        if z3.is_quantifier(x):
            go(x.body(), True)
            return
        if inside and x.get_id() in by_id:
            found.add(by_id[x.get_id()])
        if z3.is_app(x):
            for c in x.children():
                go(c, inside)
    go(p.inv(s, z3.Int("qc_o")), False)
    return tuple(f for f in p.fields if f in found or f in p.counts)


class _ByCounts:
    """A closed formula over a proof's fields (the encoded invariant, an action's hypotheses), built once
    per tuple of values of its quantified counts (:func:`quantified_counts`: a prefix-sum ghost over a
    concrete count is unrolled; ``finite``: none, the quantifiers are instantiated over the universe,
    :func:`instantiate`), decided on each concrete state by substituting the other fields."""

    def __init__(self, p: Proof, nobj: int, finite: bool, tag: str, build: Callable[[St], Any]) -> None:
        self.p, self.nobj, self.finite = p, nobj, finite
        self.counts = () if finite else quantified_counts(p)
        self.sym = fresh(p.fields, tag)
        self.by_counts: dict[tuple[int, ...], Any] = {}
        self._build = build
        #: each substituted field's (constant name, field, kind), read from Z3 once, not per state
        self._names = [(self.sym[f].decl().name(), f, k) for f, k in p.fields.items() if f not in self.counts]

    def formula(self, state: dict[str, Any]) -> Any:
        key = tuple(state[f] for f in self.counts)
        e = self.by_counts.get(key)
        if e is None:
            e = self._build(self.sym.set(**{f: iv(state[f]) for f in self.counts}))
            e = z3.BoolVal(e) if isinstance(e, bool) else e
            if self.finite:
                e = instantiate(e, list(range(self.nobj)) + [-1])
            self.by_counts[key] = e
        return e

    def subs(self, state: dict[str, Any]) -> list[tuple[Any, Any]]:
        return [(self.sym[f], concrete(k, state[f])) for _nm, f, k in self._names]


class InvariantEval(_ByCounts):
    """The encoded invariant of a proof at every object of a projected state (:class:`_ByCounts`):
    by :mod:`z3native`, cross-checked with Z3 on a sample, or by Z3 (a solver call where a quantifier
    remains)."""

    def __init__(self, p: Proof, nobj: int, finite: bool = False,
                 formula: Callable[[Any, Any], Any] | None = None) -> None:
        #: the formula evaluated (default the inductive invariant; the named one: :func:`named_eval`)
        f = formula if formula is not None else p.inv
        super().__init__(p, nobj, finite, "iv" if finite else "ivc",
                         lambda sc: z3.And(*[f(sc, z3.IntVal(i)) for i in range(nobj)]))
        self.progs: dict[int, tuple[Any, native.Program | None]] = {}

    def holds(self, state: dict[str, Any]) -> bool:
        expr = self.formula(state)
        k = expr.get_id()
        if k not in self.progs:
            self.progs[k] = (expr, native.build([expr]))   # the term kept alive with its program

        def by_z3() -> bool:
            subs = self.subs(state)
            return Compiled._truth(substitute(expr, *subs) if subs else expr)

        return native.checked(self.progs[k][1],
                              lambda: {nm: native_value(kind, state[f]) for nm, f, kind in self._names},
                              lambda v: bool(v[0]), by_z3, f"the encoded {self.p.id}")


class HypEval(_ByCounts):
    """An action's proof hypotheses (:func:`proofs.hyp_formula` at object 0) on a concrete projected
    state and arguments (:class:`_ByCounts`), decided by substitution (and a solver call where a
    quantifier remains)."""

    def __init__(self, p: Proof, act: Act, nobj: int, finite: bool) -> None:
        from memspec.invariants.formal.proofs import hyp_formula

        super().__init__(p, nobj, finite, "hy", lambda sc: hyp_formula(p, act, sc, self.a, iv(0)))
        self.act, self.a = act, _args(act, "hya")   # after the state's constants, as they always were made

    def holds(self, state: dict[str, Any], args: dict[str, Any]) -> bool:
        expr = self.formula(state)
        subs = self.subs(state) + [(self.a[n], concrete(k, args[n])) for n, k in self.act.params.items()]
        return Compiled._truth(substitute(expr, *subs) if subs else expr)


#: built invariant evaluators, compiled actions and hypothesis evaluators, shared by every walk of a run.
#: Keyed by the functions themselves (never by an invariant's name alone), so a planted break gets its own
_INV_EVALS: dict[Any, InvariantEval] = {}
_COMPILED: dict[Any, "Compiled"] = {}
_HYP_EVALS: dict[Any, HypEval] = {}


def inv_eval(p: Proof, nobj: int, finite: bool) -> InvariantEval:
    return _formula_eval(p, p.inv, nobj, finite)


def named_eval(p: Proof, nobj: int, finite: bool) -> InvariantEval:
    """The evaluator of the invariant the row is named for (:func:`proofs.named_of`: the inductive
    invariant without its auxiliary and ghost conjuncts) on concrete projected states."""
    from memspec.invariants.formal.proofs import named_of

    return _formula_eval(p, named_of(p), nobj, finite)


def _formula_eval(p: Proof, f: Callable[[Any, Any], Any], nobj: int, finite: bool) -> InvariantEval:
    return memo(_INV_EVALS, (f, tuple(p.fields.items()), p.counts, nobj, finite),
                 lambda: InvariantEval(p, nobj, finite, formula=f))


def compiled_for(p: Proof, act: Act, nobj: int, npages: int, compare: tuple[str, ...], finite: bool) -> "Compiled":
    if not any(p.fields[f] == ARR2B for f in compare):
        npages = 1  # the page count sizes only the compared page sets: one build for every count
    return memo(_COMPILED, (act.step, act.pre, tuple(act.params.items()), tuple(p.fields.items()), nobj, npages,
                             compare, finite), lambda: Compiled(p, act, nobj, npages, compare, finite))


def hyp_eval(p: Proof, act: Act, nobj: int, finite: bool) -> HypEval:
    return memo(_HYP_EVALS, (p.inv, p.lemmas, p.inst, act.step, act.pre, tuple(p.fields.items()), nobj, finite),
                 lambda: HypEval(p, act, nobj, finite))


#: fields of an encoding that hold what a step returned (not state): an error branch leaves them as they were
RETURN_FIELDS = frozenset({"ret", "answer"})


#: with per-branch quotas, the walk's soft step budget per sample asked (``samples``): past it,
#: one sample per branch is enough
SOFT_STEPS_PER_SAMPLE = 40

#: with per-branch quotas, how often a step is drawn among the actions whose adapters are still
#: short (at most): the last short adapters are short of a rare branch, which the states other
#: actions build reach; a walk that mostly repeats the short actions reaches it later
QUOTA_FAVOUR = 0.0

#: an outcome seen fewer times than this is still sampled past an adapter's share
RARE = 3


def _share(n: int, weight: float) -> int:
    return n if weight >= 1 else max(1, math.ceil(n * weight))


def walk_and_compare(machine: Any, init: Callable[[], Any], adapters: list[Adapter], proofs: dict[str, Proof],
                     samples: int, seed: int, too_big: Callable[[Any], bool], max_steps: int = 400000,
                     restart_every: int = RESTART, inv_samples: int = 0, favour: float = 0.85,
                     per_branch: int | None = None, prior: list[AgreementReport] | None = None,
                     soft_steps: int | None = None, perturb: int | None = None) -> list[AgreementReport]:
    """Walk ``machine`` from ``init()``; at each step whose action has adapters,
    compare; stop when every adapter has enough samples.  ``favour``: how
    often a step is drawn among the actions whose adapters still need samples
    (a focused walk lowers it, so the actions building rare states run too).

    Enough: ``samples`` samples per adapter (its cap); or, with ``per_branch``,
    ``per_branch`` agreeing samples on every outcome branch of the encoded
    action (:func:`proofs.branches`), at most ``samples`` in all.  Then a step
    whose spec outcome already has its quota is skipped before it is projected
    (unless a branch still short is one the spec's outcome names do not decide),
    so the evaluations go to the branches still short.  ``prior``: reports of
    earlier walks (a focused walk that reaches a rare branch), whose branch
    counts count towards the quotas.  ``soft_steps`` (default
    ``SOFT_STEPS_PER_SAMPLE x samples``): past this many steps a branch needs
    one sample, not ``per_branch`` (a rare branch ends the walk as soon as it
    is reached).  ``perturb`` (default :data:`agreement_perturb.PER_STATE`; 0: off): on each state
    where a row compares the invariants, that many perturbed copies compared too (the executable
    invariant on the copy, the encoding on its projection: :mod:`memspec.invariants.formal.agreement_perturb`;
    their own seeded draws, so the walk is the same with or without).  Deterministic in ``seed``;
    nothing depends on time."""
    from memspec.invariants.formal.proofs import branches as branch_set

    rng = random.Random(seed)
    chooser = RandomChooser(rng)
    reps = {a.keys()[0]: AgreementReport(*a.keys()[0]) for a in adapters}
    for a in adapters:
        for k in a.keys()[1:]:
            mine, theirs = proofs[a.invariant], proofs[k[0]]
            if (mine.fields != theirs.fields or mine.action(a.action).step is not theirs.action(a.action).step
                    or mine.action(a.action).pre is not theirs.action(a.action).pre):
                raise ValueError(f"{k[0]}/{a.action} is not {a.invariant}/{a.action}: it needs its own adapter")
            reps[k] = AgreementReport(*k)
    quota_mode = per_branch is not None and per_branch > 0
    soft = soft_steps if soft_steps is not None else SOFT_STEPS_PER_SAMPLE * samples
    past_soft = False
    if quota_mode:
        favour = min(favour, QUOTA_FAVOUR)

    def cap(n: int, most: int | None, a: Adapter) -> int:   # of the run's n, the adapter's most and share
        return min(n, most or n, n if quota_mode else _share(n, a.weight))

    want = {k: cap(samples, a.max_samples, a) for a in adapters for k in a.keys()}
    want_inv = {k: cap(inv_samples, a.max_inv_samples, a) for a in adapters for k in a.keys()}
    key_of = {id(a): a.keys()[0] for a in adapters}
    quota: dict[tuple[str, str, str], int] = {}
    bset: dict[tuple[str, str, str], list[str]] = {}
    if quota_mode:
        for a in adapters:
            k = key_of[id(a)]
            quota[k] = min(per_branch, want[k])  # type: ignore[type-var]
            bset[k] = branch_set(proofs[a.invariant], proofs[a.invariant].action(a.action))

    # the prior walks' samples per encoded branch and per spec outcome, counted with this walk's
    before: dict[str, dict[tuple[str, str, str], dict[str, int]]] = {"branches": {}, "outcomes": {}}
    for r0 in prior or []:
        for of, dst in before.items():
            d = dst.setdefault((r0.invariant, r0.action, r0.spec_action), {})
            for b, n in getattr(r0, of).items():
                d[b] = d.get(b, 0) + n

    led: dict[tuple[str, str, str], set[tuple[str, str]]] = {k: set() for k in reps}  # (spec outcome, branch) seen

    def nb(k: tuple[str, str, str], b: str, of: str = "branches") -> int:
        return getattr(reps[k], of).get(b, 0) + before[of].get(k, {}).get(b, 0)

    def satisfied(a: Adapter) -> bool:
        k = key_of[id(a)]
        r = reps[k]
        if r.samples >= want[k]:
            return True
        if not quota_mode:
            return False
        return all(nb(k, b) >= (quota[k] if not past_soft else 1) for b in bset[k])

    def wanted(a: Adapter, taken: str) -> bool:
        """Is a sample of ``a`` whose spec outcome is ``taken`` still needed?"""
        k = key_of[id(a)]
        r = reps[k]
        if quota_mode:
            q = quota[k] if not past_soft else 1
            if nb(k, taken, "outcomes") < q:
                return True
            # a branch still short that this spec outcome has led to, or one never reached yet
            # (which spec outcome leads to it is not known): the sample may be the one
            return any((taken, b) in led[k] or nb(k, b) == 0 for b in bset[k] if nb(k, b) < q)
        if r.samples >= want[k] and (a.weight >= 1 or r.outcomes.get(taken, 0) >= RARE):
            return False
        if a.balance and r.outcomes.get(taken, 0) >= max(1, samples // a.balance) and r.skipped < 5 * samples:
            r.skipped += 1
            return False
        return True

    by_spec: dict[str, list[Adapter]] = {}
    users: dict[str, list[Adapter]] = {}  # spec action -> the adapters it samples or helps
    for a in adapters:
        by_spec.setdefault(a.spec_action, []).append(a)
        users.setdefault(a.spec_action, []).append(a)
        for h in a.helpers:
            users.setdefault(h, []).append(a)
    done = {id(a): satisfied(a) for a in adapters}
    for a in adapters:
        if done[id(a)]:  # enough before the first step (a prior walk's samples)
            for k in a.keys():
                reps[k].enough_at = 0
    open_by_name = {name: sum(1 for a in ads if not done[id(a)]) for name, ads in users.items()}
    n_open = sum(1 for a in adapters if not done[id(a)])

    def update(a: Adapter) -> None:
        nonlocal n_open
        if not done[id(a)] and satisfied(a):
            done[id(a)] = True
            for k in a.keys():
                reps[k].enough_at = step_no
            n_open -= 1
            for name in {a.spec_action, *a.helpers}:
                open_by_name[name] -= 1

    from memspec.spec.invariants import BY_ID as SPEC_INVARIANTS
    # the executable invariants this walk's rows are named for, asserted at every state it visits
    exec_ids: dict[str, list[AgreementReport]] = {}
    for k, r in reps.items():
        exec_ids.setdefault(getattr(proofs[k[0]], "declared_by", k[0]), []).append(r)

    def assert_exec(where: str) -> None:
        for i, rs in exec_ids.items():
            why = SPEC_INVARIANTS[i].check(state)
            if why is not None:
                for r in rs:
                    if len(r.exec_violations) < 20:
                        r.exec_violations.append(f"{i} fails {where}: {why}")

    from memspec.invariants.formal import agreement_perturb as PT

    n_perturb = PT.PER_STATE if perturb is None else perturb
    perturber = PT.Perturber(seed * 7919 + 33)

    def perturb_rows(act: Any, args: dict[str, Any], taken: str, todo: list[Any]) -> None:
        """The rows of ``todo`` that compare the invariants on this (pre-step) state: each also on
        ``n_perturb`` perturbed copies of it (one deep copy, shared)."""
        base: list[Any] = []
        lv: list[Any] = []   # the state's leaves, enumerated once for every row

        def copy_of() -> Any:
            if not base:
                base.append(copy.deepcopy(state))
            return base[0]

        for ad, _rep, _pr in todo:
            for key in ad.keys():
                inv_id = key[0]
                if reps[key].inv_samples >= want_inv[key]:
                    continue
                r_, p_ = reps[key], proofs[inv_id]
                exec_id = getattr(p_, "declared_by", inv_id)

                def evaluate(pattern: str, where: str, pr: Any, why: str | None, r_: Any = r_, p_: Any = p_,
                             ad: Adapter = ad, inv_id: str = inv_id, exec_id: str = exec_id) -> None:
                    if pr is None:
                        r_.perturb_skipped += 1
                        return
                    enc_state, _a, u = pr
                    r_.perturbed += 1
                    r_.level = type(state).__name__
                    if why is None:
                        if not named_eval(p_, u.nobj, ad.finite).holds(enc_state):
                            if PT.is_shadowed(inv_id, pattern):
                                r_.shadowed += 1
                            else:
                                r_.exec_weaker.append(
                                    f"{where} (a state near the one before {act.name}{args}): the executable "
                                    f"{exec_id} holds, the encoded {inv_id} (named) fails")
                    else:
                        r_.exec_rejected += 1
                        if inv_eval(p_, u.nobj, ad.finite).holds(enc_state):
                            r_.enc_weaker[pattern] = r_.enc_weaker.get(pattern, 0) + 1

                if not lv:
                    lv.append(PT.leaves(state))
                picks = perturber.pick(inv_id, state, n_perturb, getattr(state, "page", 1) or 1, lv[0])
                r_.perturb_skipped += PT.perturbed(
                    state, picks, SPEC_INVARIANTS[exec_id].check,
                    lambda st, ad=ad: ad.project(st, args, taken), evaluate, copy_of)

    state = init()
    assert_exec("at the initial state")
    steps_since = 0
    for step_no in range(max_steps):
        if quota_mode and not past_soft and step_no >= soft:
            # past the soft budget, one sample per branch is enough: only branches never sampled
            # keep the walk going (and a branch no step reaches then ends it at max_steps, unsampled)
            past_soft = True
            for a in adapters:
                update(a)
        if n_open == 0:
            break
        if steps_since >= restart_every or too_big(state):
            state, steps_since = init(), 0
            assert_exec("at the initial state")
        steps_since += 1
        acts = [a for a in machine.actions if usable(a, state)]
        # favour actions whose adapters still need samples
        needy = [a for a in acts if open_by_name.get(a.name)]
        pool = needy if needy and rng.random() < favour else acts
        if not pool:
            state, steps_since = init(), 0
            continue
        act = pick_action(pool, rng)
        args, outs, branch = draw_branch(act, state, chooser)
        if branch is None:
            continue
        allowed = {outcome_name(b) for b in outs.branches}
        taken = outcome_name(branch)
        todo = []
        for ad in by_spec.get(act.name, []):
            rep = reps[key_of[id(ad)]]
            if done[id(ad)] or not wanted(ad, taken):
                if quota_mode and not done[id(ad)]:
                    rep.skipped += 1
                continue
            t0 = time.perf_counter()
            pr = ad.project(state, args, taken)
            rep.seconds += time.perf_counter() - t0
            if pr is None:
                rep.skipped += 1
                continue
            todo.append((ad, rep, pr))
        # an encoding on another invariant's machine (G1 on S15's) is compared with that invariant's check
        spec_before = {k[0]: SPEC_INVARIANTS[getattr(proofs[k[0]], "declared_by", k[0])].check(state) is None
                       for ad, rep, _pr in todo for k in ad.keys() if reps[k].inv_samples < want_inv[k]}
        if n_perturb and spec_before:
            perturb_rows(act, args, taken, todo)
        value = follow(branch)
        assert_exec(f"after {act.name}{args} -> {taken}")
        for ad, rep, (enc_state, enc_args, u) in todo:
            t0 = time.perf_counter()
            p = proofs[ad.invariant]
            enc_act = p.action(ad.action)
            c = compiled_for(p, enc_act, u.nobj, u.pages, ad.compare, ad.finite)
            if taken == "ok":
                expected, perm = ad.expected(state, u, value), {"ok"}
                if ad.permit is not None:
                    perm = ad.permit(value, enc_args)
            else:
                # an error branch: the encoding's post-state (unchanged) against the spec's state after
                # the branch, projected (what a step returned keeps its value: no answer was given)
                pre = flatten(enc_state, p.fields, ad.compare, u)
                try:
                    post = ad.expected(state, u, value)
                except Exception as e:  # noqa: BLE001 - the projection itself fails: a disagreement
                    post = {("projection", None): f"{type(e).__name__}: {e}"}
                expected = {k: (pre.get(k, v) if k[0] in RETURN_FIELDS else v) for k, v in post.items()}
                perm = allowed - {"ok"}
            got = c.values(enc_state, enc_args)
            ok = ("projection", None) not in expected and c.agrees(got, perm, expected)
            got_out, mismatch = None, None
            if ok:
                got_out = got[("outcome", None)]
            else:
                diff = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
                mismatch = (f"{act.name}{args} spec {taken} (permits {sorted(allowed)}), encoding "
                            f"{got[('outcome', None)]}; differing (encoding, spec): {diff}")
            holds: dict[Any, bool] = {}  # encoded invariant (by function) on this projection
            for key in ad.keys():
                inv_id, r_ = key[0], reps[key]
                p_ = proofs[inv_id]
                # a concrete witness that this branch's proof hypotheses are satisfiable (once per branch)
                if got_out is not None and got_out not in r_.hyp_witnessed and len(r_.hyp_refuted) < 3:
                    if hyp_eval(p_, p_.action(ad.action), u.nobj, ad.finite).holds(enc_state, enc_args):
                        r_.hyp_witnessed[got_out] = 1
                    elif spec_before.get(inv_id, True):
                        r_.hyp_refuted.append(f"before {act.name}{args} -> {got_out}: the executable invariant "
                                              f"holds but {inv_id}/{ad.action}'s hypotheses do not")
                if r_.inv_samples < want_inv[key]:
                    # invariant agreement: the encoded invariant on the projected (pre-step) state
                    # against the executable invariant on the spec state it projects
                    if p_.inv not in holds:
                        holds[p_.inv] = inv_eval(p_, u.nobj, ad.finite).holds(enc_state)
                    enc_holds = holds[p_.inv]
                    spec_holds = spec_before[inv_id]
                    r_.inv_samples += 1
                    if enc_holds != spec_holds:
                        r_.inv_disagreements.append(
                            f"before {act.name}{args}: spec invariant {'holds' if spec_holds else 'fails'}, "
                            f"encoding's {'holds' if enc_holds else 'fails'} on {enc_state}")
                r_.samples += 1
                r_.outcomes[taken] = r_.outcomes.get(taken, 0) + 1
                if got_out is not None:
                    r_.branches[got_out] = r_.branches.get(got_out, 0) + 1
                    led[key].add((taken, got_out))
                if mismatch is not None:
                    r_.mismatches.append(mismatch)
            rep.seconds += time.perf_counter() - t0
            update(ad)
    return list(reps.values())
