"""The spec on its own: Hypothesis stateful tests over the action tables,
the generated documentation, and the ``spec-check``/``doc`` commands."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings

from memspec.spec.core import Returns
from memspec.spec.doc import render
from memspec.spec.mechanism import MECHANISM
from memspec.spec.selfcheck import random_walk, state_machine
from memspec.spec.system import SYSTEM

STATS: dict[str, dict[str, int]] = {"system": {}, "mechanism": {}}

SystemSpec = state_machine(SYSTEM, stats=STATS["system"])
SystemSpec.TestCase.settings = settings(settings.default, max_examples=max(200, settings.default.max_examples),
                                        stateful_step_count=max(50, settings.default.stateful_step_count))
TestSystemSpec = SystemSpec.TestCase

MechanismSpec = state_machine(MECHANISM, stats=STATS["mechanism"])
MechanismSpec.TestCase.settings = settings(settings.default, max_examples=100, stateful_step_count=40)
TestMechanismSpec = MechanismSpec.TestCase


def test_stateful_runs_really_ran():
    """The two stateful classes took their examples and steps (run here if
    pytest did not run them first, e.g. when this test is selected alone)."""
    if not STATS["system"].get("examples"):
        TestSystemSpec("runTest").runTest()
    if not STATS["mechanism"].get("examples"):
        TestMechanismSpec("runTest").runTest()
    assert STATS["system"]["examples"] >= 200 and STATS["system"]["steps"] >= 2000
    assert STATS["mechanism"]["examples"] >= 100


def test_every_action_is_reachable_in_a_random_walk():
    """Each action is drawn, and every action with a Returns branch returns, in some walk."""
    for machine in (MECHANISM, SYSTEM):
        seen, returned = set(), set()
        for cfg in ((True, True), (True, False), (False, True)):
            for seed in range(4):
                for st in random_walk(machine, dict(capacity=64 * 4096, page=4096, virtual_backing=cfg[0],
                                                    shared_mapping=cfg[1], ep=True), steps=300, seed=seed):
                    seen.add(st.action)
                    if st.branch.startswith("returns"):
                        returned.add(st.action)
        assert seen == {a.name for a in machine.actions}, set(a.name for a in machine.actions) - seen
        assert len(returned) >= len(machine.actions) - 2, {a.name for a in machine.actions} - returned


def test_a_broken_spec_is_caught_by_the_stateful_driver(monkeypatch):
    """The driver itself can fail: plant S11's double refund and run a random walk."""
    from memspec.spec import ep

    original = ep.refund

    def twice(s, holder, n):
        original(s, holder, n)
        s.free += n

    monkeypatch.setattr(ep, "refund", twice)
    with pytest.raises(AssertionError, match="S11"):
        for seed in range(10):
            random_walk(SYSTEM, dict(capacity=64 * 4096, page=4096, virtual_backing=True, shared_mapping=True),
                        steps=300, seed=seed)


def test_doc_check_passes_and_detects_staleness(tmp_path, capsys):
    from memspec.commands import doc

    assert doc.main(["--check"]) == 0, "docs/SPEC.md is stale: run `memspec doc`"
    stale = tmp_path / "SPEC.md"
    stale.write_text(render().replace("S13", "S31", 1))
    assert doc.main(["--check", "--output", str(stale)]) == 1
    assert doc.main(["--output", str(stale)]) == 0
    assert doc.main(["--check", "--output", str(stale)]) == 0


def test_spec_md_shows_roles_actions_invariants():
    from memspec.spec.caching import CACHING
    from memspec.spec.caching import CATALOG as CACHING_CATALOG
    from memspec.spec.invariants import CATALOG

    text = render()
    for machine in (MECHANISM, SYSTEM, CACHING):
        assert f"## Machine `{machine.name}`" in text
        for a in machine.actions:
            assert f"`{a.name}(" in text
        for role in {a.role for a in machine.actions}:
            assert f"### {role}" in text
    for e in CATALOG + CACHING_CATALOG:
        assert f"| {e.id} | {e.title} | *{e.quote}*" in text
    assert text.count("stateDiagram-v2") == 2
    assert render() == text, "generation is deterministic"


def test_spec_check_command(capsys):
    from memspec.commands import spec_check

    assert spec_check.main(["--examples", "5", "--steps", "10", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "system" in out and "mechanism" in out and "PASS" in out


def test_witnesses_are_accepted_by_their_own_branches():
    """In every state of a walk, every Returns witness is accepted by its branch's guard."""
    rng = random.Random(5)
    from memspec.spec.core import RandomChooser
    from memspec.spec.selfcheck import usable

    for machine in (MECHANISM, SYSTEM):
        s = machine.init(capacity=64 * 4096, page=4096, virtual_backing=True, shared_mapping=True, ep=True)
        ch = RandomChooser(rng)
        for _ in range(150):
            acts = [a for a in machine.actions if usable(a, s)]
            for a in acts:
                outs = a.step(s, **a.draw_args(s, RandomChooser(random.Random(rng.random()))))
                for b in outs.branches:
                    if isinstance(b, Returns) and b.witness is not None:
                        assert b.matches(b.witness()), (a.name, b.describe)
            from memspec.spec.selfcheck import spec_step

            spec_step(machine, s, acts[rng.randrange(len(acts))], ch)


def test_spec_check_command_fails_on_a_broken_spec(monkeypatch, capsys):
    from memspec.commands import spec_check
    from memspec.spec import ep

    original = ep.refund

    def twice(s, holder, n):
        original(s, holder, n)
        s.free += n

    monkeypatch.setattr(ep, "refund", twice)
    assert spec_check.main(["--machine", "system", "--examples", "30", "--steps", "30", "--no-shrink"]) == 1
    assert "FAIL" in capsys.readouterr().out
