"""memspec.invariants.formal.z3native: Z3 terms evaluated by Python must give Z3's own values."""

from __future__ import annotations

import random

import pytest
import z3

from memspec.invariants.formal import z3native as N

MiB = 1 << 20
x, y = z3.Ints("x y")
b = z3.Bool("b")
A = z3.Array("A", z3.IntSort(), z3.IntSort())
B = z3.Array("B", z3.IntSort(), z3.IntSort())
M = z3.Array("M", z3.IntSort(), z3.ArraySort(z3.IntSort(), z3.BoolSort()))
j = z3.Int("j")


def _arr(v, leaf):  # type: ignore[no-untyped-def]
    d, items = v
    out = z3.K(z3.IntSort(), leaf(d))
    for i, w in items.items():
        out = z3.Store(out, i, leaf(w))
    return out


def _env(rnd: random.Random) -> dict:
    def ints() -> tuple:
        return (rnd.randint(-3, 3), {i: rnd.randint(-3, 3) for i in rnd.sample(range(-2, 6), rnd.randint(0, 4))})

    return {"x": rnd.randint(-12, 12), "y": rnd.choice([-7, -3, -2, -1, 1, 2, 3, 5]), "b": rnd.random() < 0.5,
            "A": ints(), "B": ints(),
            "M": ((False, {}), {i: (rnd.random() < 0.5, {k: rnd.random() < 0.5 for k in range(3)})
                                for i in range(rnd.randint(0, 3))})}


def _z3_value(t: z3.ExprRef, env: dict) -> object:
    bool_row = lambda v: _arr(v, z3.BoolVal)  # noqa: E731
    m = z3.K(z3.IntSort(), z3.K(z3.IntSort(), z3.BoolVal(False)))
    for i, row in env["M"][1].items():
        m = z3.Store(m, i, bool_row(row))
    subs = [(x, z3.IntVal(env["x"])), (y, z3.IntVal(env["y"])), (b, z3.BoolVal(env["b"])),
            (A, _arr(env["A"], z3.IntVal)), (B, _arr(env["B"], z3.IntVal)), (M, m)]
    return N.from_z3(z3.simplify(z3.substitute(t, *subs)))


LAM = z3.Lambda([j], z3.If(j > x, A[j] + 1, A[j]))
TERMS = [
    x / y, x % y, -x / y, (x - 7) % y, z3.If(b, x + y * 3, -x), z3.Abs(x - y),
    z3.Select(z3.Store(A, x, y), 3), z3.Store(A, x, y) == z3.Store(B, x, y), A == z3.Store(A, 1, A[1]),
    z3.Distinct(x, y, 3), z3.Implies(b, x > y), z3.Xor(b, x <= y), z3.And(b, x >= y, x < 4), z3.Or(b, x != y),
    LAM[3], z3.Store(LAM, 2, 7)[2], z3.Store(LAM, 2, 7)[x], z3.If(b, LAM, A)[y],
    z3.Lambda([j], z3.Select(z3.Lambda([j], A[j] * 2), j + 1) + B[j])[x],
    z3.Select(z3.If(b, LAM, z3.Store(A, 1, 5)), 1), M[x][y], z3.Store(M, 1, z3.K(z3.IntSort(), True))[1][x],
    z3.If(M[0][1], A, B) == A, z3.Store(A, x, 5),
]


@pytest.mark.slow
def test_every_operator_gives_z3s_value_on_random_states() -> None:
    prog = N.Program(TERMS)
    rnd = random.Random(7)
    for _ in range(400):
        env = _env(rnd)
        for t, got in zip(TERMS, prog(env)):
            want = _z3_value(t, env)
            assert N.same(got, want), (t, env, got, want)
    assert prog.size > len(TERMS)


def test_div_and_mod_are_smtlibs_euclidean_ones() -> None:
    """Python's ``//`` and ``%`` differ from SMT-LIB's for a negative divisor: -7 div -2 is 4 (remainder 1)."""
    prog = N.Program([x / y, x % y])
    assert prog({"x": -7, "y": -2}) == (4, 1)
    assert prog({"x": 7, "y": -2}) == (-3, 1)
    assert prog({"x": -7, "y": 2}) == (-4, 1)


def test_outside_the_fragment_is_refused_not_guessed() -> None:
    f = z3.Function("f", z3.IntSort(), z3.IntSort())
    assert N.build([z3.ForAll([j], A[j] > 0)]) is None
    assert N.build([f(x) + 1]) is None
    assert N.build([z3.ToReal(x) / 2]) is None
    prog = N.Program([z3.If(b, x / y, x)])
    with pytest.raises(N.Unsupported, match="division by zero"):
        prog({"x": 3, "y": 0, "b": False})   # eager: the other arm is evaluated too, and refuses
    with pytest.raises(ValueError, match="no value for the free constant"):
        prog({"x": 3, "b": True})
    with pytest.raises(N.Unsupported, match="lambda"):
        N.Program([LAM == A])({"x": 0, "A": (0, {})})


def test_a_deep_store_chain_builds_without_recursion() -> None:
    arr = A
    for i in range(5000):
        arr = z3.Store(arr, i, arr[i] + 1)
    got = N.Program([arr[4999], arr[6000]])({"A": (2, {})})
    assert got == (3, 2)


def test_cross_checks_run_on_the_first_evaluation_and_every_nth() -> None:
    prog = N.Program([x + 1])
    due = []
    for k in range(2 * N.CROSS_CHECK_EVERY):
        prog({"x": k})
        due.append(prog.due_cross_check())
    assert due[0] and due[N.CROSS_CHECK_EVERY - 1] and due[-1]
    assert sum(due) == 3


def test_a_wrong_evaluation_is_caught_by_the_cross_check_in_the_caching_agreement(monkeypatch) -> None:
    """A defect of the evaluator (here: every Boolean negated) is raised at the first evaluation, never
    reported as an invariant disagreement."""
    from memspec.invariants.formal import proofs_caching_agree as CA
    from memspec.spec import caching as C

    st = C.init(policy="seed", capacity=44 * MiB)
    vals, _refs = CA.project(st)
    assert all(CA.encoded_invariants(vals).values())        # the real evaluator: every invariant holds
    real_call = N.Program.__call__
    monkeypatch.setattr(N.Program, "__call__", lambda self, env: tuple(not v for v in real_call(self, env)))
    monkeypatch.setattr(CA, "_INV_TERMS", {})
    with pytest.raises(AssertionError, match="a defect of memspec.invariants.formal.z3native"):
        CA.encoded_invariants(vals)


def test_a_wrong_evaluation_is_caught_by_the_cross_check_in_the_s_agreement(monkeypatch) -> None:
    from memspec.invariants.formal import agreement as AG
    from memspec.invariants.formal.agreement_adapters import run_all

    real_call = N.Program.__call__

    def wrong(self, env):  # type: ignore[no-untyped-def]
        vals = real_call(self, env)
        return (not vals[0],) + vals[1:] if len(vals) > 1 else vals   # a transition's precondition negated

    monkeypatch.setattr(N.Program, "__call__", wrong)
    monkeypatch.setattr(AG, "_COMPILED", {})
    with pytest.raises(AssertionError, match="a defect of memspec.invariants.formal.z3native"):
        run_all(20, 0, 0, None, walks=("tickets",))
