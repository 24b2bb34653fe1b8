"""The results of a conformance run: typed records the runner, the report
and the reproductions share (one per counterexample, one per plan run), and
the verdict of a row with its one precedence rule."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

from memspec.invariants import engine as E
from memspec.invariants import verdicts as V


class Verdict(str, enum.Enum):
    """What a cell or a row of the report says.  A ``str``: it compares
    equal to its text (``Verdict.PASS == "PASS"``)."""

    FAIL = "FAIL"
    ERROR = "ERROR"
    UNTESTED = "UNTESTED"
    PASS = "PASS"
    NA = "N/A"
    #: the invariant has no action at that level: not part of it (never a PASS)
    NONE = "\u2014"

    def __str__(self) -> str:
        return self.value


#: worst first: a row is its worst cell (a FAIL anywhere is the row's FAIL)
PRECEDENCE = (Verdict.FAIL, Verdict.ERROR, Verdict.UNTESTED, Verdict.PASS, Verdict.NA, Verdict.NONE)


def combine(cells: list) -> Verdict:
    """The row's verdict from its cells' (one rule, used everywhere): the
    worst by :data:`PRECEDENCE`; N/A only when no cell is more; a row of
    nothing but "\u2014" is "\u2014"."""
    got = {Verdict(c) if not isinstance(c, Verdict) else c for c in cells if c is not None}
    for v in PRECEDENCE:
        if v in got:
            return v
    return Verdict.NONE


def rule_of(check_id: str) -> str:
    """``S8`` of ``S8.alignment``."""
    return check_id.split(".", 1)[0]


@dataclass
class Failure:
    """One shrunk counterexample (or, for a hang or a crash, the example's
    steps up to the call that never came back)."""

    target: str
    level: str
    invariant: str
    cause: str
    reason: str
    trace: list
    steps_to_detection: int | None
    repro: str | None = None
    flaky: bool = False
    #: the device capacity of the failing example (per-example capacity; None: the plan's)
    capacity: int | None = None
    #: the other failures the same root cause showed (``"S10 [observation] ..."``), when the
    #: diagnosis (:func:`diagnose`) named another rule than the first check that failed, or a
    #: replay proved them consequences (:func:`~memspec.invariants.blame.relate`)
    consequences: list = field(default_factory=list)
    #: the clause of ``invariant`` that broke (``alignment`` of S8), when the rule has named clauses
    check: str | None = None
    #: the failure's mask key (:func:`~memspec.invariants.engine.Run.fail`): what a later pass masks
    key: tuple | None = None
    #: the mask keys of the other checks that failed at the same step (masked with it)
    also_keys: tuple = ()
    #: the other failures' checks its steps run through and need (its reproduction masks them)
    needs_masks: tuple = ()
    #: the other failures' checks masked while it was shrunk and diagnosed (a supervisor that
    #: replays it does the same, so both name the same rule)
    diagnosed_masks: tuple = ()
    #: another failure's rule this one is likely a consequence of (not proved by replay: shown with
    #: its own row and reproduction, after that one); set by no rule of the harness today
    likely_cause: str | None = None

    @property
    def check_id(self) -> str:
        """``S8.alignment``, or the invariant when no clause is named."""
        return f"{self.invariant}.{self.check}" if self.check else self.invariant

    @property
    def shrunk_length(self) -> int:
        return len(self.trace)


@dataclass
class PlanInfo:
    """What the supervisor knows of a plan run in a child: what the report,
    the reproduction and the progress display read of a :class:`~memspec.invariants.engine.Plan`."""

    target: str
    level: str
    invariants: list          # [(id, title)]
    na: dict
    capabilities: dict
    actions: list             # action names drawn
    timeout: float
    factory_kwargs: dict
    machine_ref: str | None
    stats: E.Stats = field(default_factory=E.Stats)
    mutant: Any = None
    declares: dict = field(default_factory=dict)  # invariant id -> declaring action names
    undrawn: dict = field(default_factory=dict)   # action name -> capabilities it needs that the target lacks
    #: invariants with no action or observation at this level (their cells read "\u2014")
    absent: list = field(default_factory=list)
    #: ``{invariant: [[action, outcome, describe], ...]}``: the outcomes a PASS needs
    witnesses: dict = field(default_factory=dict)
    #: the environment the target needs at process start (``factory.memspec_env``)
    env: dict = field(default_factory=dict)
    #: the reproduction files written for this plan's failures (none overwrites another)
    repro_paths: set = field(default_factory=set, repr=False, compare=False)

    @property
    def invariant_ids(self) -> list[str]:
        return [i for i, _t in self.invariants]

    @property
    def action_names(self) -> list[str]:
        return list(self.actions)

    def titles(self) -> dict[str, str]:
        return dict(self.invariants)


class PlanView(Protocol):
    """What the report, the reproductions and the verdicts read of a plan:
    an engine :class:`~memspec.invariants.plan.Plan` (in-process) and a
    :class:`PlanInfo` (the supervisor's, from a child's "plan" message)
    both have it, under the same names."""

    target: str
    level: str
    na: dict
    capabilities: dict
    timeout: float
    factory_kwargs: dict
    machine_ref: str | None
    mutant: Any
    stats: E.Stats
    repro_paths: set

    @property
    def declares(self) -> dict: ...
    @property
    def witnesses(self) -> dict: ...
    @property
    def undrawn(self) -> dict: ...
    @property
    def absent(self) -> list: ...
    @property
    def env(self) -> dict: ...
    @property
    def action_names(self) -> list: ...
    @property
    def invariant_ids(self) -> list: ...
    def titles(self) -> dict: ...


@dataclass
class PlanResult:
    target: str
    level: str
    #: an engine Plan (in-process) or a PlanInfo (supervised): see :class:`PlanView`
    plan: Union[E.Plan, "PlanInfo", None]
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)   # spec/target/harness errors (not a target FAIL)
    seconds: float = 0.0
    #: accepting steps each declaring action needs for a PASS (:mod:`~memspec.invariants.verdicts`)
    min_accepted: int = V.MIN_ACCEPTED
    #: what the report must say of how the run was made (a target judged by random walks)
    notes: list = field(default_factory=list)

    def coverage(self) -> dict[str, dict]:
        """Per invariant: tested or not, why, and the counts per declaring action."""
        if self.plan is None:
            return {}
        return V.coverage(self.plan.declares, self.plan.action_names, self.stats, self.min_accepted,
                          self.plan.witnesses)

    @property
    def stats(self) -> E.Stats:
        return self.plan.stats if self.plan is not None else E.Stats()

    def rows(self) -> list[tuple[str, str, str, str]]:
        """``(invariant id, title, status, detail)`` for every invariant of the level."""
        if self.plan is None:
            return []
        out = []
        failed: dict = {}
        for f in self.failures:
            failed.setdefault(f.invariant, []).append(f)
        titles = self.plan.titles()
        cov = self.coverage()
        absent = not_at_level(self.plan)
        for inv in self.plan.invariant_ids:
            if inv in failed:
                out.append((inv, titles.get(inv, ""), Verdict.FAIL.value, fail_detail(failed[inv])))
            elif inv in absent:
                out.append((inv, titles.get(inv, ""), Verdict.NONE.value,
                            "not part of this level: no action or observation of it here"))
            elif inv in self.plan.na:
                out.append((inv, titles.get(inv, ""), "N/A", self.plan.na[inv]))
            elif self.errors:
                out.append((inv, titles.get(inv, ""), "ERROR", self.errors[0]))
            elif inv in cov and cov[inv].get("na"):
                out.append((inv, titles.get(inv, ""), "N/A", cov[inv]["na"]))
            elif inv in cov and not cov[inv]["tested"] and (why := self._capability_absent(inv)):
                out.append((inv, titles.get(inv, ""), "N/A", why))
            elif inv in cov and not cov[inv]["tested"]:
                out.append((inv, titles.get(inv, ""), "UNTESTED", cov[inv]["reason"]))
            else:
                out.append((inv, titles.get(inv, ""), "PASS", rests_on(cov.get(inv) or {}, self.stats)))
        for inv, fs in failed.items():
            if inv == "NONDET":   # the harness could not replay the target: not a verdict on it
                out.append((inv, "answers differ on replay", Verdict.ERROR.value,
                            fs[0].reason + " (memspec's draws depend on earlier answers: the rows above rest "
                            "on the examples before it)"))
            elif inv not in titles:
                out.append((inv, "", Verdict.FAIL.value, fail_detail(fs)))
        return out

    def _capability_absent(self, inv: str) -> str | None:
        """The N/A reason when no action declaring ``inv`` is drawn because
        each needs a capability the target lacks (``use_owned`` without an
        Execution Provider); None otherwise."""
        decl = self.plan.declares.get(inv) or []
        undrawn = self.plan.undrawn
        if not decl or any(a not in undrawn for a in decl):
            return None
        need = sorted({r for a in decl for r in undrawn[a]})
        return f"capability absent: {', '.join(need)} (needed by {', '.join(decl)})" if need else None

    @property
    def ok(self) -> bool:
        return not self.failures and not self.errors

    @property
    def untested(self) -> list[str]:
        """Invariants with no FAIL/ERROR/N/A whose actions did not run enough to judge."""
        return [inv for inv, _t, st, _d in self.rows() if st == "UNTESTED"]


def _undrawn(plan: PlanView) -> dict:
    """``{action name: [capabilities it needs that the target lacks]}`` for
    the machine's actions a plan does not draw (an engine Plan or a PlanInfo)."""
    return plan.undrawn


def fail_detail(failures: list) -> str:
    """One line per counterexample of a rule, each naming the check that
    broke (``[S8.alignment] [outcome] ...``)."""
    return " | ".join((f"[{f.check_id}] [{f.cause}] {f.reason}" if f.check else f"[{f.cause}] {f.reason}")
                      + (f" (likely a consequence of {f.likely_cause}: that rule breaks in this failure's state)"
                         if f.likely_cause else "")
                      for f in failures)


def rests_on(cov: dict, stats: Any) -> str:
    """What a PASS rests on, in a few words: its witnesses seen, else the
    accepted answers of the actions that declare it."""
    wit = cov.get("witnesses") or {}
    if wit:
        parts = [f"{d} x{n}" for d, n in wit.items()]
    else:
        acts = cov.get("actions") or {}
        parts = [f"{a} x{c.get('accepted', 0)}" for a, c in sorted(acts.items(), key=lambda kv: -kv[1].get("accepted", 0))
                 if c.get("accepted")][:3]
    if not parts:
        return f"rests on: checked after each of {getattr(stats, 'steps', 0)} steps"
    return "rests on: " + ", ".join(parts)


def not_at_level(plan: PlanView) -> set:
    """The invariants of ``plan``'s machine that have no action declaring them
    and no observation blamed on them at its level: their cells read
    "\u2014" (not part of this level), never PASS."""
    return set(plan.absent)


def _last_action(f: Any) -> str | None:
    """The action a failure's trace ended on (None when the trace is empty or
    its last entry was never decoded, e.g. a supervised child that died)."""
    last = f.trace[-1] if f.trace else None
    return getattr(last, "action", None)


def database_key(plan: Any, flavour: str = "stateful") -> bytes:
    m = plan.mutant.name if plan.mutant is not None else ""
    return f"memspec:{flavour}:{plan.target}:{plan.level}:{m}:{plan.machine.name}".encode()


def _flatten(e: BaseException) -> list[tuple[BaseException, bool]]:
    from hypothesis.errors import FlakyFailure

    if isinstance(e, BaseExceptionGroup):
        flaky = isinstance(e, FlakyFailure)
        out = []
        for sub in e.exceptions:
            out += [(x, flaky or f) for x, f in _flatten(sub)]
        return out
    return [(e, False)]
