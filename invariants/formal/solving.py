"""Every Z3 check of the formal side goes through :class:`Query`: a solver whose answer, and whose
cost, depend on the query alone, and whose CPU time is bounded even where Z3's own budget is not.

**Its own context.**  Z3 numbers terms as they are made, in one context per process unless told
otherwise, and its search orders atoms and clauses by those numbers.  A query built in the main
context is therefore a different search in every process that made other terms first: in one
pytest worker of CI the lemma ``align`` of ``unmap:cache`` ran 4,032 s, and 0.4 s alone.  A
:class:`Query` copies what it is given (``translate``) into a context of its own, so the numbers
follow the query's own structure: the same query costs the same in every process.  A model is
copied back into the main context, where the caller's terms live.

**A budget in CPU, twice.**  The budget is Z3's resource limit (``rlimit``, units calibrated per
CPU second, :data:`RLIMIT_PER_SECOND`), never the clock: an answer must not depend on how loaded
the machine is.  Some of Z3's inner loops poll for cancellation without counting resources:
``align`` above spent 83 s of CPU in a QF_AUFLIA check while its resource count rose by
3.7 million units of a 40 million budget.  So a watchdog thread reads the checking thread's own
CPU clock and interrupts the context at :data:`CPU_CAP_FACTOR` times the budget (plus
:data:`CPU_CAP_SLACK_S`).  Thread CPU time moves far less with load than the clock (``prove``'s CPU
was about 1.3 times quiet with both cores busy, its wall time 6 times); and a query Z3 bounds itself
stops at its resource limit well before the cap.  An interrupted attempt answers
``unknown``, as an exhausted one does; :attr:`Query.capped` says which.  Z3 notices the interrupt
where it polls for it, which one loop did late (a QF_AUFLIA attempt capped at 31 s stopped after 64 s):
the cap bounds a runaway, it does not make one cheap, so a check that can run away is given short
attempts (``ladder``).

**Several seeds.**  Where one random seed's search runs away, another's often answers at once; a
check is a short :data:`LADDER` of attempts, each a share of the budget under its own seed, ending
with the whole budget under seed 0.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import z3

#: Z3's resource units per CPU second, measured on this project's machines
#: (a nonlinear query cancelled at 20,000,000 units after 5.2 s of CPU).
RLIMIT_PER_SECOND = 4_000_000
#: the watchdog's CPU cap: this many times the check's budget ...  Far above the budget, so that the
#: cap stops runaways only and Z3's own count decides every other check: a check that exhausts its
#: count takes up to about 2 times its budget in CPU on a machine with both cores busy (2.1 times
#: measured: a 0.62 s attempt cancelled after 1.29 s); at 1.5 a loaded run's cap cut checks the
#: count would have let answer
CPU_CAP_FACTOR = 3.0
#: ... plus this many seconds (a small budget's cap is not a handful of scheduler ticks)
CPU_CAP_SLACK_S = 1.0
#: the attempts of a check, ``(random seed, share of the budget)``: Z3's search under one seed can run
#: away on a query another seed answers at once (the unguarded C8 refutation: seeds 0 and 3 ran past
#: 12 s of CPU, seeds 1 and 2 found the heap in 0.07 s); the last attempt is the whole budget under
#: seed 0, so whatever one full check answered is still answered.  At worst a check costs 1.25 times
#: its budget in resource units (and 1.25 times :data:`CPU_CAP_FACTOR` times it in CPU, plus the slack).
LADDER = ((0, 1 / 16), (1, 1 / 16), (2, 1 / 8), (0, 1.0))
#: how often the watchdog reads the checking thread's CPU clock
_POLL_S = 0.05


def _ast(e: Any, ctx: z3.Context) -> Any:
    if isinstance(e, bool):
        return z3.BoolVal(e, ctx)
    return e if e.ctx is ctx else e.translate(ctx)


def _thread_cpu_clock() -> Any:
    """The calling thread's CPU clock (read from any thread), or the process's where the platform
    has no per-thread clock (macOS): then other busy threads of the process count too."""
    try:
        clock = time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return time.process_time
    return lambda: time.clock_gettime(clock)


class Query:
    """A Z3 solver bounded by ``budget_ms`` of CPU (resource units, and the watchdog's cap), for
    ``logic`` (``None``: Z3's default solver), in a context of its own unless ``isolated`` is
    false, its attempts ``ladder`` (default :data:`LADDER`).  :meth:`add` takes terms of any
    context; :meth:`model` gives a model of the main context."""

    def __init__(self, budget_ms: int, logic: str | None = None, isolated: bool = True,
                 ladder: tuple[tuple[int, float], ...] = ()) -> None:
        if budget_ms <= 0:
            raise ValueError(f"a query's budget must be positive, got {budget_ms} ms")
        self.ctx = z3.Context() if isolated else z3.main_ctx()
        self.logic = logic
        self.solver = self._new_solver()
        #: the solver of the last answer (:attr:`solver`, or a fresh one of a later attempt)
        self.answered = self.solver
        self.budget_ms = budget_ms
        self.seed: int | None = None
        self.ladder = ladder or LADDER
        self._frames: list[list[Any]] = [[]]   # what was added, per push level (a later attempt re-adds it)
        #: the last check was stopped by the watchdog's CPU cap (Z3's resource count had not run out)
        self.capped = False

    def _new_solver(self) -> z3.Solver:
        return z3.SolverFor(self.logic, ctx=self.ctx) if self.logic else z3.Solver(ctx=self.ctx)

    def add(self, *terms: Any) -> None:
        ts = [_ast(t, self.ctx) for t in terms]
        self._frames[-1] += ts
        self.solver.add(*ts)

    def push(self) -> None:
        self.solver.push()
        self._frames.append([])

    def pop(self) -> None:
        self.solver.pop()
        self._frames.pop()

    def set(self, key: str, value: Any) -> None:
        """A solver option; ``random_seed`` fixes the seed (one attempt with the whole budget)."""
        if key == "random_seed":
            self.seed = int(value)
        else:
            self.solver.set(key, value)

    def check(self) -> z3.CheckSatResult:
        """Check under the budget: the attempts of :data:`LADDER` in turn (a share of the budget under
        a random seed each) until one answers sat or unsat; unknown if none does.  The first attempt is
        this (incremental) solver's; each later one a fresh solver given everything added so far, so an
        attempt does not inherit the state an earlier one left (the last is exactly one fresh check
        under seed 0 with the whole budget).  Each attempt is bounded by its share in resource units
        and, by the watchdog, in CPU."""
        ladder = ((self.seed, 1.0),) if self.seed is not None else self.ladder
        r = z3.unknown
        for i, (seed, share) in enumerate(ladder):
            sol = self.solver
            if i:
                sol = self._new_solver()
                sol.add(*[t for frame in self._frames for t in frame])
            sol.set("random_seed", seed)
            sol.set("rlimit", max(1, int(share * self.budget_ms / 1000 * RLIMIT_PER_SECOND)))
            self.answered = sol
            r = self._attempt(sol, share * self.budget_ms / 1000)
            if r != z3.unknown:
                break
        return r

    def _attempt(self, sol: z3.Solver, budget_s: float) -> z3.CheckSatResult:
        cpu = _thread_cpu_clock()
        cap = cpu() + CPU_CAP_FACTOR * budget_s + CPU_CAP_SLACK_S
        done = threading.Event()
        lock = threading.Lock()
        fired = []

        def watch() -> None:
            while not done.wait(_POLL_S):
                if cpu() > cap:
                    with lock:
                        if not done.is_set():
                            fired.append(True)
                            self.ctx.interrupt()
                    return

        w = threading.Thread(target=watch, name="memspec-z3-watchdog", daemon=True)
        w.start()
        try:
            r = sol.check()
        finally:
            with lock:
                done.set()
            w.join()
        self.capped = bool(fired) and r == z3.unknown
        return r

    def model(self) -> z3.ModelRef:
        m = self.answered.model()
        return m if self.ctx is z3.main_ctx() else m.translate(z3.main_ctx())

    def reason_unknown(self) -> str:
        return "CPU cap (Z3's resource count had not run out)" if self.capped else self.answered.reason_unknown()

    def sexpr(self) -> str:
        return self.solver.sexpr()


def check(*terms: Any, budget_ms: int, logic: str | None = None) -> tuple[z3.CheckSatResult, z3.ModelRef | None]:
    """One isolated check of the conjunction of ``terms``: the answer, and the model when sat."""
    q = Query(budget_ms, logic)
    q.add(*terms)
    r = q.check()
    return r, (q.model() if r == z3.sat else None)
