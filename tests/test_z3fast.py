"""memspec.invariants.formal.z3fast builds the very terms z3py's And/Or/Implies/Not build."""

from __future__ import annotations

import pytest
import z3

from memspec.invariants.formal import z3fast as F

p, q, r = z3.Bools("p q r")
x = z3.Int("x")
i = z3.Int("i")


@pytest.mark.parametrize("make", [
    lambda m: m.And(p, q, r), lambda m: m.And([p, q]), lambda m: m.And((p, x > 1)), lambda m: m.And(p, True),
    lambda m: m.And(p, z3.ForAll([i], i > x)), lambda m: m.And(), lambda m: m.Or(p, q), lambda m: m.Or([p]),
    lambda m: m.Or(False, p), lambda m: m.Implies(p, x < 2), lambda m: m.Implies(True, p), lambda m: m.Not(p),
    lambda m: m.Not(False), lambda m: m.Not(z3.Exists([i], i == x)),
])
def test_same_term_as_z3py(make) -> None:  # type: ignore[no-untyped-def]
    fast, plain = make(F), make(z3)
    assert z3.eq(fast, plain), (fast, plain)
    assert fast.get_id() == plain.get_id()


def test_and_of_a_non_boolean_is_refused_as_z3py_refuses_it() -> None:
    with pytest.raises(z3.Z3Exception):
        F.And(p, x)


@pytest.mark.parametrize("module", ["proofs_caching_heap", "proofs_seed000"])
def test_the_proofs_hypotheses_are_the_terms_z3py_builds(module: str, monkeypatch) -> None:
    """Every action's hypothesis (invariant and precondition) and step, built with z3fast and again with
    the module's operators set back to z3py's: the same ASTs."""
    import importlib

    from memspec.invariants.formal.proofs import _args, _sort, fresh

    mod = importlib.import_module(f"memspec.invariants.formal.{module}")
    counter = [0]

    def fresh_int(prefix: str = "x") -> z3.ArithRef:   # the same names in both builds (Z3's own differ)
        counter[0] += 1
        return z3.Int(f"{prefix}!t{counter[0]}")

    monkeypatch.setattr(z3, "FreshInt", fresh_int)
    if module == "proofs_caching_heap":
        def builds():  # type: ignore[no-untyped-def]
            s = mod.St({f: z3.Const(f"{f}@t", _sort(k)) for f, k in mod.FIELDS.items()})
            out = []
            for act in mod.actions() + mod.phase_actions():
                a = mod.St({n: z3.Int(f"{n}@ta") for n in act.params})
                o, s2 = act.step(s, a)
                out += [mod.inv(s), act.pre(s, a), *[v for v in s2.values() if z3.is_expr(v)]]
            return out
    else:
        from memspec.invariants.formal.proofs_catalog import all_proofs

        def builds():  # type: ignore[no-untyped-def]
            out = []
            for pr in all_proofs():
                s = fresh(pr.fields, "t")
                o = z3.Int("o@t")
                out.append(pr.inv(s, o))
                for act in pr.actions:
                    a = _args(act, "ta")
                    pre = act.pre(s, a)
                    _out, s2 = act.step(s, a)
                    out += [e for e in (pre, *s2.values()) if z3.is_expr(e)]
            return out
    fast = builds()
    counter[0] = 0
    for name in ("And", "Or", "Implies", "Not"):
        for m in (mod, *mod.PARTS):   # the module and the parts it is assembled from
            if hasattr(m, name):
                monkeypatch.setattr(m, name, getattr(z3, name))
    plain = builds()
    assert len(fast) == len(plain) > 20
    assert all(z3.eq(a, b) for a, b in zip(fast, plain))
