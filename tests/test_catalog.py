"""The invariant catalogs (S1-S15 in memspec.spec.invariants, C1-C9 in
memspec.spec.caching) are the one list of ids, titles and quotes: each entry
matches its predicate, can fire (an action or observation of its machine
names it), and has a planted-bug mutant.  Adding an invariant to a catalog
without these fails here, by id."""

from __future__ import annotations

import pytest

from memspec.invariants.mutants import all_mutants
from memspec.spec.caching import CACHING
from memspec.spec.caching import CATALOG as CACHING_CATALOG
from memspec.spec.invariants import ALL, CATALOG
from memspec.spec.mechanism import MECHANISM
from memspec.spec.system import SYSTEM

ENTRIES = [(e, (MECHANISM, SYSTEM)) for e in CATALOG] + [(e, (CACHING,)) for e in CACHING_CATALOG]
MUTANTS = all_mutants()


def test_catalogs_are_the_predicates_ids_titles_and_quotes():
    assert [(e.id, e.title, e.quote) for e in CATALOG] == [(i.id, i.title, i.quote) for i in ALL]
    assert [(e.id, e.title, e.quote) for e in CACHING_CATALOG] == [(i.id, i.title, i.quote) for i in CACHING.invariants]
    ids = [e.id for e, _ in ENTRIES]
    assert len(ids) == len(set(ids)), "an id is used twice"
    assert {e.seed for e, _ in ENTRIES} <= {"000", "003"}


@pytest.mark.parametrize("entry,machines", ENTRIES, ids=[e.id for e, _ in ENTRIES])
def test_every_invariant_can_fire_and_has_a_mutant(entry, machines):
    named = {i for m in machines for a in m.actions for i in a.invariants} | {
        o.blame for m in machines for o in m.observations}
    assert entry.id in named, f"no action or observation of {[m.name for m in machines]} is checked against {entry.id}"
    assert entry.id in {i.id for m in machines for i in m.invariants}, f"{entry.id} is not among the machine's invariants"
    assert any(m.invariant == entry.id for m in MUTANTS), f"no planted-bug mutant is blamed on {entry.id}"


# --------------------------------------------------------------------------
# No restated ranges: a catalog that gains an id is a row everywhere
# --------------------------------------------------------------------------

@pytest.fixture
def scratch_catalogs(monkeypatch):  # type: ignore[no-untyped-def]
    """Both catalogs with one scratch invariant more (S16, C10), as an engineer adding one would leave them
    before writing its proof."""
    from memspec.spec import invariants as seed000
    from memspec.spec.caching import invariants as caching
    from memspec.spec.invariants import CatalogEntry

    s16 = CatalogEntry("S16", "scratch: an invariant with no proof yet", "(scratch)", "000")
    c10 = CatalogEntry("C10", "scratch: a caching invariant with no proof yet", "(scratch)", "003")
    monkeypatch.setattr(seed000, "CATALOG", seed000.CATALOG + (s16,))
    monkeypatch.setattr(seed000, "IDS", seed000.IDS + ("S16",))
    monkeypatch.setattr(caching, "CATALOG", caching.CATALOG + (c10,))
    monkeypatch.setattr(caching, "IDS", caching.IDS + ("C10",))
    return s16, c10


def test_prove_reads_its_ids_from_the_catalogs() -> None:
    from memspec.commands import prove as P
    from memspec.spec.caching import IDS as C_IDS
    from memspec.spec.invariants import IDS as S_IDS

    assert P.acceptance_ids() == P.ACCEPTANCE_IDS == S_IDS + C_IDS
    assert P.known_ids() == [*S_IDS, *C_IDS, "G1", "P1"]


def test_a_new_catalog_id_is_a_row_of_prove_and_of_its_self_test(scratch_catalogs, capsys) -> None:  # type: ignore[no-untyped-def]
    from memspec.commands import prove as P
    from memspec.invariants.formal import proofs_selftest as T

    # `memspec prove S16` is a row that is not proved, naming what is missing (not "unknown id")
    capsys.readouterr()
    rc = P.main(["S16", "--jobs", "1", "--no-caching"])
    out = capsys.readouterr().out
    assert "unknown invariant" not in out, out
    assert rc == 1 and "S16" in out and "NOT PROVED" in out and "no Z3 proof" in out, out
    # the acceptance rows, the ids prove takes and the rows the self-test must cover include both
    for ids in (P.ACCEPTANCE_IDS, P.acceptance_ids(), P.known_ids(), T.expected_covered()):
        assert "S16" in ids and "C10" in ids, ids
    # a --json file written before S16 existed does not pass the acceptance check
    rows = {"invariants": {i: {} for i in P.ACCEPTANCE_IDS if i != "S16"}}
    assert "S16: missing" in P.check_acceptance(rows)
    # the self-test has no guard-removed break to plant for an invariant with no proof: it says so
    with pytest.raises(LookupError, match="S16 .*no Proof"):
        T.catalog()


def test_a_new_invariant_with_a_check_is_told_what_its_proof_needs(scratch_catalogs, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """S16 with an executable check (S2's predicate, under a new id) and no proof: ``prove S16`` fails,
    naming the fields the check reads, the spec actions that write them (derived exactly as S2's own row
    derives its coverage, so the two sets are equal) and the closest existing machine."""
    from memspec.commands import prove as P
    from memspec.invariants.formal import coverage as F
    from memspec.invariants.formal.proofs_catalog import all_proofs
    from memspec.spec import invariants as seed000

    F.footprints()   # a derivation made before S16 existed (another test's) has no read set for it
    s16 = seed000._inv("S16", "scratch: S2's predicate under a new id", "(scratch)", seed000.S2.check)
    monkeypatch.setattr(seed000, "ALL", seed000.ALL + [s16])
    capsys.readouterr()
    rc = P.main(["S16", "--jobs", "1", "--no-caching"])
    out = capsys.readouterr().out
    assert rc == 1 and "NOT PROVED" in out and "no Z3 proof" in out and "no executable check" not in out, out
    need = P._what_a_proof_needs("S16")
    (s2,) = [p for p in all_proofs() if p.id == "S2"]
    assert need["required"] == sorted(F.row_coverage(s2).required) and need["required"], need
    assert need["reads"] and all(r in out for r in need["reads"][:8]), (need, out)
    assert f"closest machine: {need['closest_machine']}'s encodes" in out, out
    assert "the spec actions that write them: " + ", ".join(need["required"]) in out, out


def test_a_catalog_id_with_no_check_is_told_so(scratch_catalogs, capsys) -> None:  # type: ignore[no-untyped-def]
    from memspec.commands import prove as P

    capsys.readouterr()
    assert P.main(["S16", "--jobs", "1", "--no-caching"]) == 1
    assert "no executable check: memspec.spec.invariants.ALL has no Invariant S16" in capsys.readouterr().out


#: ranges from 1 in prose that name a part of a catalog on purpose, and why (any other names the whole one)
PROSE_PARTS = {
    "C1-C3": "proofs_caching.py: the rows of its bounded search; bench/README.md: bench runs named C1-C3",
}


def prose_range_errors() -> list[str]:
    """Each line of the docs and sources whose range from 1 ("S1-S15", "C1–C9") does not end at its
    catalog's last id (and is not one of :data:`PROSE_PARTS`)."""
    import re
    from pathlib import Path

    from memspec.spec import invariants as seed000
    from memspec.spec.caching import invariants as caching

    root = Path(__file__).resolve().parents[1]
    catalogs = {"S": seed000.IDS, "C": caching.IDS}
    files = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "bench").glob("*.md"))]
    for folder in ("spec", "invariants", "memspec", "tests", "bench"):
        files += sorted((root / folder).rglob("*.py"))
    bad = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            for prefix, last in re.findall(r"\b([SC])1\s*[-–]\s*\1(\d+)\b", line):
                ids = catalogs[prefix]
                if f"{prefix}{last}" != ids[-1] and f"{prefix}1-{prefix}{last}" not in PROSE_PARTS:
                    bad.append(f"{f.relative_to(root)}:{n}: {prefix}1-{prefix}{last} (catalog: {ids[0]}..{ids[-1]})")
    return bad


def test_prose_ranges_of_ids_match_the_catalogs() -> None:
    """Prose that names a catalog as a range ("S1-S15", "C1–C9") names all of it: the catalog's first and
    last id.  A catalog that gains an id fails here at each such line, so none is left stale."""
    from memspec.spec.caching import IDS as C_IDS
    from memspec.spec.invariants import IDS as S_IDS

    for prefix, ids in (("S", S_IDS), ("C", C_IDS)):
        assert list(ids) == [f"{prefix}{k}" for k in range(1, len(ids) + 1)], f"{prefix} ids not 1..n: {ids}"
    bad = prose_range_errors()
    assert not bad, "\n".join(bad)


def test_prose_ranges_are_stale_once_a_catalog_gains_an_id(scratch_catalogs) -> None:  # type: ignore[no-untyped-def]
    bad = prose_range_errors()
    assert any(b.startswith("README.md:") and "S1-S15" in b for b in bad), bad
    assert any("C1-C9" in b for b in bad), bad
