"""invariants/formal/solving: a query's search does not depend on the terms the process made before,
its CPU is bounded by the watchdog even where Z3's resource count is not, and what comes back
(answers, models) is of the main context."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import z3

from memspec.invariants.formal import solving as S


def _pigeons(n: int) -> z3.BoolRef:
    """n + 1 pigeons in n holes: unsat, and hard for Z3's SAT core (whose resource count grows slowly:
    with n = 9 a 200 ms budget does not stop it; it answers after about 1.7 s of CPU)."""
    p = [[z3.Bool(f"p{i}_{j}") for j in range(n)] for i in range(n + 1)]
    cl = [z3.Or(*row) for row in p]
    cl += [z3.Or(z3.Not(p[i][j]), z3.Not(p[k][j])) for j in range(n) for i in range(n + 1) for k in range(i + 1, n + 1)]
    return z3.And(*cl)


_HISTORY = r"""
import json, random, sys, z3
from memspec.invariants.formal import solving as S
if sys.argv[2] == "history":   # the query's own variables made first, in the other order, and other terms
    junk = [z3.Bool(f"v{i}") for i in reversed(range(60))] + [z3.Int(f"j{i}") + i for i in range(500)]
rnd = random.Random(7)
xs = [z3.Bool(f"v{i}") for i in range(60)]
q = S.Query(20000, isolated=sys.argv[1] == "isolated")
q.add(z3.And(*[z3.Or(*[xs[j] if rnd.random() < .5 else z3.Not(xs[j]) for j in rnd.sample(range(60), 3)])
               for _ in range(262)]))
r = q.check()
st = q.answered.statistics()
print(json.dumps([str(r), {k: st.get_key_value(k) for k in st.keys() if k.startswith("sat ")}]))
"""


def _run_history(isolated: str, history: str) -> list:
    p = subprocess.run([sys.executable, "-c", _HISTORY, isolated, history], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_an_isolated_query_searches_the_same_whatever_terms_the_process_made_before() -> None:
    """The same random 3-SAT query (unsat) in two fresh interpreters, one of which first made the query's
    variables in the other order: in the main context Z3's search differs (its conflict and decision counts),
    in a :class:`Query`'s own context it is the same search."""
    main = [_run_history("main", h) for h in ("none", "history")]
    assert main[0][0] == main[1][0] == "unsat"
    assert main[0][1] != main[1][1], main        # the history changes the main context's search ...
    iso = [_run_history("isolated", h) for h in ("none", "history")]
    assert iso[0] == iso[1] and iso[0][0] == "unsat" and iso[0][1].get("sat conflicts", 0) > 0, iso   # ... not this one


def test_the_watchdog_interrupts_a_check_past_its_cpu_cap(monkeypatch) -> None:
    monkeypatch.setattr(S, "CPU_CAP_FACTOR", 0.0)
    monkeypatch.setattr(S, "CPU_CAP_SLACK_S", 0.1)
    q = S.Query(600_000)        # a resource budget of 10 minutes: only the cap can stop it
    q.add(_pigeons(9))
    t0 = time.thread_time()
    r = q.check()
    spent = time.thread_time() - t0
    assert r == z3.unknown and q.capped and "CPU cap" in q.reason_unknown(), (r, q.reason_unknown())
    assert spent < 1.0, spent   # CPU of this thread, not the clock: about the cap and one poll
    # the interrupt does not outlive its check: the next check on the same context answers
    q2 = S.Query(20_000, isolated=False)
    q2.add(z3.Int("x") > 1)
    assert q2.check() == z3.sat and not q2.capped


def test_a_check_under_its_cap_answers_and_is_not_marked_capped() -> None:
    q = S.Query(200)            # cap 2.4 s of CPU; Z3's count does not stop this query, which answers
    q.add(_pigeons(7))
    assert q.check() == z3.unsat and not q.capped


def test_answers_and_models_come_back_in_the_main_context() -> None:
    x, y = z3.Ints("x y")
    q = S.Query(1000)
    q.add(x > 1, y == x + 1, True)
    assert q.ctx is not z3.main_ctx()
    assert q.check() == z3.sat
    m = q.model()
    assert m.eval(y - x).as_long() == 1 and m.eval(x).ctx is z3.main_ctx()
    r, none = S.check(x > 1, x < 1, budget_ms=100)
    assert r == z3.unsat and none is None
    q.push()
    q.add(y < 0, x > 5)
    assert q.check() == z3.unsat
    q.pop()
    assert q.check() == z3.sat


@pytest.mark.parametrize("budget", [0, -5])
def test_a_query_without_a_positive_budget_is_refused(budget: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        S.Query(budget)
