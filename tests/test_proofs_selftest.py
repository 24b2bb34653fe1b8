"""``memspec prove --self-test``: planted breaks are caught, by the rule they break;
a plant that changes nothing is not (the detectors can stay silent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memspec.invariants.formal.proofs_selftest import catalog

ROOT = Path(__file__).resolve().parents[1]

#: the planted breaks the self-test must kill, each by its own rule
PLANTED = ("S10 encoding: allocate does not record its context (no pin)", "S4 spec: poll frees regardless of fences",
           "S11 kernel: can_grant ignores what is free", "C3 spec: freed blocks are not coalesced")

# One run of the self-test over the planted breaks and two inert plants on the detectors two of them use
# (the system spec-check, the caching walk): the baselines those detectors share run once, not once per
# test.  It runs in a fresh interpreter, as ``memspec prove --self-test`` does (what the detectors see
# depends on the modules imported: Hypothesis draws integers from a pool of the project's constants);
# every break is judged in a process of its own forked from there, whatever else is in the run.  The
# answer comes back as one JSON line: the rows (name, catch, does the catch name the rule) and problems.
_RUN = r"""
import json, sys
from contextlib import contextmanager
from memspec.invariants.formal.proofs_selftest import Break, catalog, names, run_self_test

planted = [b for b in catalog() if b.name.startswith(tuple(json.loads(sys.argv[1])))]

@contextmanager
def nothing():
    yield

inert = [Break("S3 nothing planted", "spec", "S3", ("spec-check:system",), patch=nothing),
         Break("C3 nothing planted", "spec", "C3", ("spec-walk:caching",), patch=nothing)]
rows, problems = run_self_test(planted + inert)
print("SELFTEST " + json.dumps({"rows": [[b.name, c, bool(c) and names(b, c)] for b, c, _s in rows],
                                "problems": {k: str(v) for k, v in problems.items()}}))
"""


@pytest.fixture(scope="module")
def self_test_run() -> dict:
    p = subprocess.run([sys.executable, "-c", _RUN, json.dumps(PLANTED)], cwd=ROOT, capture_output=True,
                       text=True, timeout=850, env={k: v for k, v in os.environ.items()
                                                    if k != "MEMSPEC_TEST_IN_FRESH_PROCESS"})
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("SELFTEST ")]
    assert p.returncode == 0 and len(lines) == 1, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    doc = json.loads(lines[0][len("SELFTEST "):])
    assert not doc["problems"], doc["problems"]   # no detector fires on the unbroken project
    return doc


def test_catalog_has_20_breaks_over_every_seed000_invariant() -> None:
    cat = catalog()
    assert len(cat) >= 20
    from memspec.spec.invariants import IDS

    assert {b.invariant for b in cat} >= set(IDS)
    assert {b.kind for b in cat} == {"encoding", "spec", "kernel", "engine"}   # engine: the prover trusting a hypothesis


def test_planted_breaks_are_killed_by_their_rule(self_test_run) -> None:
    assert len([b for b in catalog() if b.name.startswith(PLANTED)]) == len(PLANTED)
    rows = {name: (caught, named) for name, caught, named in self_test_run["rows"]}
    for prefix in PLANTED:
        (name,) = [n for n in rows if n.startswith(prefix)]
        caught, named = rows[name]
        assert caught, f"{name} was not caught"
        assert named, f"{name}: caught by another rule: {caught}"


def test_a_plant_that_changes_nothing_is_not_caught(self_test_run) -> None:
    rows = {name: caught for name, caught, _named in self_test_run["rows"]}
    assert [rows["S3 nothing planted"], rows["C3 nothing planted"]] == [None, None]
    assert len(rows) == len(PLANTED) + 2
