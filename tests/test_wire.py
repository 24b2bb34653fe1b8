"""The child -> parent messages as typed records (issue 32): every kind
round-trips (``to_wire`` -> JSON -> ``decode`` gives the record back), and
a message that is not what its kind says -- a missing field, a wrong type,
not a dict, an unknown kind, a huge or deeply nested value -- is a
``WireError`` naming the kind and the field, never a KeyError; the parent
turns one into a harness ERROR of the plan, without an exception."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from memspec.invariants import engine as E  # noqa: E402
from memspec.invariants import fuzz, runner  # noqa: E402
from memspec.invariants import wire as W  # noqa: E402
from memspec.invariants.guard import Ending, supervise  # noqa: E402
from memspec.invariants.results import Failure  # noqa: E402


def _ts(i: int, outcome: str = "returns ok") -> E.TraceStep:
    return E.TraceStep(f"act{i}", {"size": 4096 * i, "ref": (i, "r"), "flags": [True, None]}, [i, True, 7],
                       outcome, (i, i + 1))


def _stats() -> E.Stats:
    return E.Stats(3, 40, 1.25, Counter({"alloc": 30, "free": 10}), Counter({("alloc", "returns"): 29,
                                                                            ("alloc", "raises OOM"): 1}),
                   Counter({"alloc": 30}), Counter({"alloc": 29}), Counter({"alloc.size=0": 2}), {"S1": 12}, 1)


def _failure() -> W.FailureRecord:
    return W.FailureRecord("S8", "invariant", "misaligned", (_ts(1), _ts(2, "raises X")), 12, True, 1 << 20,
                           ("S10 [observation] figure",), "alignment", ("alloc", "S8.alignment"),
                           ((None, "S10"), ("free", "S2")), "S3")


RECORDS = [
    W.Done(), W.Hello(), W.ExampleStart(1 << 30), W.ExampleStart(None),
    W.Step("alloc", "{'size': 4096}", (1, False, 3)), W.Step("free", None, (), "returns ok", (4, 5)),
    W.Progress(3, 40, 1, 7, {"alloc": 30, "free": 0}, 0.5),
    W.PlanMsg("mechanism", "reference", (("S1", "no overlap"), ("S2", "ledger")), {"S9": "no growth"},
              {"execution_provider": True, "grow": False}, ("alloc", "free"), {"S1": ("alloc",), "S2": ()},
              {"use_owned": ("execution_provider",)}, ("S2",), {"S1": (("alloc", "returns", "an allocation"),)},
              {"MALLOC_ARENA_MAX": "2"}, 5.0, 1 << 26, "pkg.mod:MACHINE"),
    W.Result("system", ("TargetError: x",), ("judged by walks",), _stats(), (_failure(),), True),
    W.Result("system", (), (), E.Stats(), ()),
    W.Error("caching", "level 'caching' does not apply"), W.Fatal("RuntimeError: boom"), W.Note("a line"),
    W.Found("mechanism", _failure(), (7, 3), False), W.Found("mechanism", _failure(), None, True),
    W.FailedExample("mechanism", (_ts(1), _ts(2)), 4096), W.FailedExample("mechanism", (), None),
    W.WorkerStats(0.5, 0.1, 2.0, 2.5, 0.0), W.Task(3), W.Shrunk(2, "system", _failure()),
    W.Replayed(2, "system", _failure()),
]


def _plain(v) -> bool:
    if v is None or type(v) in (int, str, bool, float):
        return True
    if type(v) is list:
        return all(_plain(x) for x in v)
    if type(v) is dict:
        return all(type(k) is str and _plain(x) for k, x in v.items())
    return False


def test_every_kind_has_a_record_here():
    assert {type(r).T for r in RECORDS} == set(W.KINDS)


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: f"{type(r).T}")
def test_round_trip(rec):
    m = rec.to_wire()
    assert _plain(m), m                       # plain literals only
    assert m["t"] == type(rec).T
    assert W.decode(m) == rec
    assert W.decode(json.loads(json.dumps(m))) == rec   # as it travels: one JSON line


def _fields(rec) -> list:
    return [k for k in rec.to_wire() if k != "t"]


def _wrong(v):
    """A value of another type than ``v``'s."""
    if isinstance(v, dict):
        return [1]
    if isinstance(v, str):
        return 7
    return {"bad": 1}


CASES = [(rec, name) for rec in RECORDS for name in _fields(rec)]


@pytest.mark.parametrize("rec,name", CASES, ids=[f"{type(r).T}.{n}" for r, n in CASES])
def test_a_missing_field_or_a_wrong_type_names_kind_and_field(rec, name):
    m = rec.to_wire()
    gone = {k: v for k, v in m.items() if k != name}
    if type(rec) is W.Step and name == "po":   # optional (the first step has none); pb comes with it
        assert W.decode(gone) == W.Step(rec.action, rec.args, rec.choices)
    else:
        with pytest.raises(W.WireError) as e:
            W.decode(gone)
        assert e.value.kind == type(rec).T and e.value.field == name, str(e.value)
        assert f'"{type(rec).T}" message' in str(e.value) and f'field "{name}" is missing' in str(e.value)
    bad = {**m, name: _wrong(m[name])}
    with pytest.raises(W.WireError) as e:
        W.decode(bad)
    assert e.value.kind == type(rec).T and e.value.field == name, str(e.value)


def test_a_nested_field_is_named_by_its_path():
    m = RECORDS[8].to_wire()
    assert m["t"] == "result"
    m["failures"][0]["trace"] = {"a": "x"}
    with pytest.raises(W.WireError) as e:
        W.decode(m)
    assert str(e.value) == ('harness error: malformed "result" message from the child: '
                            'field "failures[0].trace" is not a list')
    m = RECORDS[8].to_wire()
    m["failures"][0]["trace"][1]["c"] = [1, "two"]
    with pytest.raises(W.WireError, match=r'field "failures\[0\]\.trace\[1\]\.c\[1\]" is not an int'):
        W.decode(m)
    m = RECORDS[8].to_wire()
    m["stats"]["outcomes"][0] = ["alloc", "returns"]
    with pytest.raises(W.WireError, match=r'field "stats\.outcomes\[0\]" is not a list of 3'):
        W.decode(m)


@pytest.mark.parametrize("m", [None, [1, 2], "text", 3, {"no": "kind"}, {"t": 5}, {"t": "nope"}])
def test_not_a_dict_or_not_a_kind(m):
    with pytest.raises(W.WireError) as e:
        W.decode(m)
    assert e.value.field in ("<message>", "t")
    if m == {"t": "nope"}:
        assert e.value.kind == "nope" and 'field "t" names no message kind' in str(e.value)


def test_huge_and_deeply_nested_values(monkeypatch):
    big = "x" * (W.MAX_TEXT + 1)
    with pytest.raises(W.WireError, match=r'"note" message .* field "text" is too long'):
        W.decode({"t": "note", "text": big})
    with pytest.raises(W.WireError, match=r'"ex" message .* field "cap" is out of range'):
        W.decode({"t": "ex", "cap": 10 ** 40})
    nested: list = []
    for _ in range(100_000):
        nested = [nested]
    with pytest.raises(W.WireError, match=r'"p" message .* field "actions\.alloc" is not an int'):
        W.decode({**RECORDS[6].to_wire(), "actions": {"alloc": nested}})
    with pytest.raises(W.WireError, match=r'field "seconds" is not a finite number'):
        W.decode({**RECORDS[6].to_wire(), "seconds": float("inf")})
    from memspec.invariants import wire_fields

    monkeypatch.setattr(wire_fields, "MAX_ITEMS", 50)
    with pytest.raises(W.WireError, match=r'field "actions" is too long \(51 items\)'):
        W.decode({**RECORDS[6].to_wire(), "actions": {str(i): 1 for i in range(51)}})
    with pytest.raises(W.WireError, match=r'field "c" is too long'):
        W.decode({"t": "s", "a": "alloc", "args": None, "c": list(range(51))})
    # arguments are a literal's text: read by ast.literal_eval only, a bad one named
    for args, why in (("[" * 200_000, "is not a Python literal"), ("__import__('os')", "is not a Python literal"),
                      ("[1, 2]", "is not a dict literal")):
        with pytest.raises(W.WireError, match=r'"failed-example" message .* field "trace\[0\]\.args" ' + why):
            W.decode({"t": "failed-example", "level": "x", "cap": None,
                      "trace": [{"a": "alloc", "args": args, "c": [], "o": "", "b": []}]})


def test_the_childs_step_builder_is_the_records_wire_form():
    a, b = _ts(1), _ts(2)
    assert W.Step.wire_of(a, None) == W.Step("act1", W._literal_repr(a.args), (1, True, 7)).to_wire()
    assert W.Step.wire_of(b, a) == W.Step("act2", W._literal_repr(b.args), (2, True, 7), a.outcome, a.bound).to_wire()
    trace = W.steps_to_trace([W.decode(W.Step.wire_of(a, None)), W.decode(W.Step.wire_of(b, a))])
    assert trace == [a, E.TraceStep("act2", b.args, [2, True, 7], "", ())]
    assert type(trace[0].choices[1]) is bool   # a boolean choice stays one (a replay reads it back as drawn)


def test_one_failure_record_for_conform_and_fuzz():
    f = _failure().to_failure("tgt", "system")
    assert isinstance(f, Failure) and f.key == ("alloc", "S8.alignment") and f.needs_masks[0] == (None, "S10")
    assert fuzz._fail_dict(f) == W.failure_to_wire(f) == _failure().to_wire()
    assert fuzz._fail_from("tgt", "system", fuzz._fail_dict(f)) == f
    with pytest.raises(W.WireError, match=r'field "failure\.flaky" is not a bool'):
        fuzz._fail_from("tgt", "system", {**fuzz._fail_dict(f), "flaky": 1})


def test_run_options_are_checked_where_they_are_made():
    assert runner.RunOptions(examples=3, until=("S1",)).examples == 3
    for bad in ({"timeout": "5"}, {"examples": 2.5}, {"until": ["S1"]}, {"shrink": 1}, {"timeout": 0}):
        with pytest.raises(TypeError, match="run option"):
            runner.RunOptions(**bad)


# --------------------------------------------------------------------------
# The parent: a malformed message is a harness ERROR of the plan, no exception
# --------------------------------------------------------------------------

PLAN = RECORDS[7]


def _parent():
    results, done = [], []
    return runner._Parent("reference", "all", results, done, None, None, None), results, done


def test_the_parent_turns_a_malformed_result_into_a_harness_error_of_that_plan():
    p, results, done = _parent()
    p.on_message(PLAN.to_wire())
    bad = RECORDS[8].to_wire()
    bad["failures"][0]["trace"] = "not a list"
    p.on_message(bad)
    (r,) = results
    assert r.level == "mechanism" and done == ["mechanism"] and not r.failures
    assert r.errors == ['harness error: malformed "result" message from the child: '
                        'field "failures[0].trace" is not a list']
    assert r.rows() and {row[2] for row in r.rows()} <= {"ERROR", "N/A", "\u2014"}
    # the run goes on: the next plan is read as usual
    p.on_message({**PLAN.to_wire(), "level": "system"})
    p.on_message(W.Result("system", (), (), _stats(), (_failure(),)).to_wire())
    assert [r.level for r in results] == ["mechanism", "system"] and results[1].failures[0].invariant == "S8"
    assert results[1].stats.steps == 40


def test_the_parent_turns_a_malformed_plan_or_garbage_into_a_harness_error():
    p, results, done = _parent()
    p.on_message({**PLAN.to_wire(), "invariants": [["S1"]]})
    p.on_message({"t": 3})
    assert [r.level for r in results] == ["mechanism", "all"]
    assert 'malformed "plan" message' in results[0].errors[0] and 'field "invariants[0]"' in results[0].errors[0]
    assert results[1].errors[0].startswith("harness error: malformed") and p.stopped


def test_a_malformed_step_in_a_dead_childs_log_is_named_and_the_crash_still_reported():
    p, results, _done = _parent()
    p.on_message(PLAN.to_wire())
    p.on_message(W.ExampleStart(4096).to_wire())
    log = [W.Step.wire_of(_ts(1), None), W.Step.wire_of(_ts(2), _ts(1)), {"t": "s", "a": "x", "args": 5, "c": []}]
    p.died(Ending(death="the process died of signal SIGSEGV", log=log, log_steps=3, blame="S1",
                  what="step 3 (x)"))
    (r,) = results
    (f,) = r.failures
    assert f.cause == "crash" and [ts.action for ts in f.trace] == ["act1", "act2"] and f.capacity == 4096
    assert f.trace[0].outcome == "returns ok" and f.trace[-1].outcome == "kills the process"
    assert r.errors == ['harness error: malformed "s" message from the child: field "args" is not a str']


def test_a_real_child_sending_a_malformed_message_gives_an_error_not_a_crash():
    p, results, _done = _parent()

    def work(ch):
        ch.send(PLAN.to_wire())
        ch.send({"t": "result", "level": "mechanism"})   # no errors, no stats...

    end = supervise(work, timeout=30, on_message=p.on_message)
    assert end.death is None
    (r,) = results
    assert r.errors == ['harness error: malformed "result" message from the child: field "errors" is missing']


def test_fuzz_reads_its_workers_messages_through_the_same_decoder():
    p, results, _done = _parent()
    seen: list = []

    def work(ch):
        ch.send(PLAN.to_wire())
        ch.send(W.Found("mechanism", _failure()).to_wire())
        ch.send({"t": "found", "level": "mechanism", "failure": {"invariant": "S1"}})
        ch.send(W.Result("mechanism", (), (), _stats(), ()).to_wire())

    fuzz._supervised(work, fuzz.FuzzOptions(timeout=30), lambda rec: seen.append(rec) or False, p, 60)
    assert [type(r).__name__ for r in seen] == ["PlanMsg", "Found", "Result", "Done"]
    (r,) = results
    assert r.errors == ['harness error: malformed "found" message from the child: field "failure.cause" is missing']
