"""``memspec fuzz --jobs N`` reports every failure a worker found with a
reproduction that reproduces (issue 16: "a failure found by any worker is
shrunk once and reported once").

A worker's ``run_hypothesis`` keeps exploring after a failure with the
actions it ended on left out (a later *pass*), and saves that pass's
examples under the pass's own database key.  The parent's replay of the
shared database reads the whole table's key only, so before the fix a
later pass's failure came back as "not reproduced on replay" with an empty
reproduction.  Now the worker sends its failure's steps and the parent
replays them (``engine._worker_failure``).
"""

from __future__ import annotations

import json
import sys

import pytest

from memspec.commands import fuzz
from memspec.invariants import fuzz as engine
from memspec.invariants import harness as H
from memspec.invariants import runner, stateful  # noqa: F401
from memspec.invariants.discovery import TargetRef
from memspec.invariants.mutants.seed000 import _mechanism_mutant


def _leaks_on_oom(base: type) -> type:
    class LeaksOnOom(base):
        """An eager allocate that does not fit takes the free pages first and
        raises OutOfMemory without giving them back (a leak on the failure
        path: the device's physical bytes grow, S5; later allocations that
        would fit are refused, S8)."""

        def allocate(self, request):
            try:
                size = int(request.size)
                page = self._dev.page_size
                free = self._dev.free_pages()
                if size > 0 and -(-size // page) > free > 0:
                    self._dev.alloc_pages(free)   # taken, never given back
            except Exception:  # noqa: BLE001 - a bad request: the reference answers it
                pass
            return super().allocate(request)

    return LeaksOnOom


#: a target with two failures: the second is found by a later pass of the worker
leaks_on_oom = _mechanism_mutant("reference-eager", "_alloc", _leaks_on_oom)
LEAKY = TargetRef("leaks-on-oom", leaks_on_oom, "test target")


@pytest.fixture(scope="module")
def leaky_failure() -> object:
    """The planted leak's first failure, found once for the module (one pass: the tests replay it)."""
    plan = runner.make_plan(LEAKY, "mechanism")
    res = runner.run_hypothesis(plan, runner.hypothesis_settings("ci", examples=30, steps=20), seed=0,
                                more_passes=0)
    assert res.failures, "the planted leak was not found"
    return res.failures[0]


def test_a_workers_failure_is_replayed_from_its_steps(leaky_failure):
    f = leaky_failure
    sent = engine._failure_msg(f)
    json.dumps(sent)   # plain data only: it crosses the process boundary
    fresh = runner.make_plan(LEAKY, "mechanism")
    got = engine._worker_failure(fresh, f.invariant, f.cause, f.reason, sent)
    assert got.invariant == f.invariant
    assert "not reproduced" not in got.reason
    assert got.trace, "the replayed failure has steps"
    # its steps fail again (the first check to fail may be the symptom the diagnosis blamed on the rule)
    v = runner._replay_steps(fresh, H.CallGuard(), got.capacity, [(ts.action, list(ts.choices)) for ts in got.trace])
    assert v is not None and v.invariant in {got.invariant} | {c.split()[0] for c in got.consequences}, v


def test_steps_that_do_not_fail_again_keep_the_workers_steps_and_say_so(leaky_failure):
    f = leaky_failure
    sent = engine._failure_msg(f)
    clean = runner.make_plan("reference-eager", "mechanism")   # the same steps on the reference: no failure
    got = engine._worker_failure(clean, f.invariant, f.cause, f.reason, sent)
    assert "not reproduced on replay" in got.reason
    assert [ts.action for ts in got.trace] == [ts.action for ts in f.trace]
    assert got.capacity == f.capacity
    # nothing sent (a worker of an older memspec): reported as seen, no steps
    bare = engine._worker_failure(clean, f.invariant, f.cause, f.reason, None)
    assert "not reproduced on replay" in bare.reason and bare.trace == []


@pytest.mark.skipif(sys.platform != "linux", reason="--jobs forks its workers (Linux)")
def test_jobs_reports_a_later_pass_failure_with_a_reproduction_that_reproduces(tmp_path, monkeypatch):
    # the workers (forked from here) draw one Hypothesis choice per draw and one step per rule: with
    # these draws the first pass finds S8 and a later pass, with allocate left out, S5; with the packed
    # draws the first finds S5 and nothing is left for a later pass to find (this checks the reporting)
    from memspec.invariants import engine as E
    monkeypatch.setattr(E, "PACKED_DRAWS", False)
    monkeypatch.setattr(stateful, "STEPS_PER_RULE", 1)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "leaky_target.py").write_text(   # this file, importable by name in the workers
        f"import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('_fjf', {__file__!r})\n"
        f"mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        f"leaks_on_oom = mod.leaks_on_oom\n")
    out = tmp_path / "fuzz.json"
    rc = fuzz.main(["leaky_target:leaks_on_oom", "--jobs", "2", "--minutes", "2", "--level", "mechanism",
                    "--db", str(tmp_path / "db"), "--out", str(tmp_path / "repro"), "--quiet", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 1
    fails = doc["failures"]
    assert {f["invariant"] for f in fails} >= {"S5", "S8"}, fails
    for f in fails:
        assert "not reproduced" not in f["reason"], f
        assert f["steps"] > 0 and f["repro"], f


def test_until_ends_the_run_after_the_pass_that_found_the_named_invariant(monkeypatch):
    """``run_hypothesis(until=...)`` (``conform --until``): no further masked pass once a named
    invariant failed; without it the same run goes on to the leak's second failure."""
    passes = []
    orig = stateful._one_pass

    def counting(*a, **k):
        passes.append(1)
        return orig(*a, **k)

    monkeypatch.setattr(stateful, "_one_pass", counting)
    sets = runner.hypothesis_settings("ci", examples=30, steps=20)
    full = runner.run_hypothesis(runner.make_plan(LEAKY, "mechanism"), sets, seed=0, shrink_seconds=1)
    n_full = len(passes)
    assert n_full >= 2 and len({f.invariant for f in full.failures}) >= 1, [f.invariant for f in full.failures]
    first = full.failures[0].invariant
    passes.clear()
    cut = runner.run_hypothesis(runner.make_plan(LEAKY, "mechanism"), sets, seed=0, shrink_seconds=1,
                                until=frozenset({first}))
    assert len(passes) == 1 and cut.failures   # (the diagnosis may then name the rule the symptom shows)
