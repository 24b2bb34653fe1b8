"""Campaigns across machines (issue 16 deliverable 3): ``--db-readonly-github``
puts the shared GitHub artifact database, read-only, in front of the local
directory database; counterexamples from it are replayed, still-failing ones
are saved locally, and the shared one is never written.  No network: the
GitHub database is replaced by a directory stand-in where it would download.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import hypothesis.database as hdb
import pytest

from memspec.commands import fuzz

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def _files(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in d.rglob("*") if p.is_file()}


def test_open_database_layers_github_read_only_over_the_local_directory(tmp_path):
    local = tmp_path / "local"
    db = fuzz.open_database(str(local), "owner/repo", "some-artifact")
    assert isinstance(db, hdb.MultiplexedDatabase)
    parts = db._wrapped
    assert isinstance(parts[0], hdb.DirectoryBasedExampleDatabase)
    assert isinstance(parts[1], hdb.ReadOnlyDatabase)
    gh = parts[1]._wrapped
    assert isinstance(gh, hdb.GitHubArtifactDatabase)
    assert (gh.owner, gh.repo, gh.artifact_name) == ("owner", "repo", "some-artifact")
    db.save(b"k", b"v")  # saves go to the local directory only (nothing fetched, nothing sent)
    assert list(hdb.DirectoryBasedExampleDatabase(str(local)).fetch(b"k")) == [b"v"]
    assert isinstance(fuzz.open_database(str(local)), hdb.DirectoryBasedExampleDatabase)


def test_a_counterexample_from_the_shared_database_is_replayed_and_kept_locally(tmp_path, monkeypatch):
    # machine A finds a failure and its database is "uploaded".  Two jobs: the first failure stops the run
    # (one job fuzzes on to the deadline), so the budget is room to find it on a loaded machine, not a
    # duration every run pays
    a_db = tmp_path / "a-db"
    rc = fuzz.main(["mutant:foreign-free", "--seconds", "120", "--jobs", "2", "--capacity", str(16 * MiB),
                    "--db", str(a_db), "--out", str(tmp_path / "a-repro"), "--quiet"])
    assert rc == 1 and _files(a_db)
    shared_before = _files(a_db)
    # machine B reads it through --db-readonly-github (the download replaced by A's directory)
    # the workers (supervised children forked from here) open and read it: they say so in a file
    said = tmp_path / "said.txt"

    def tell(*x) -> None:
        with open(said, "a") as fh:
            fh.write(repr(x) + "\n")

    class SharedStandIn(hdb.DirectoryBasedExampleDatabase):
        def fetch(self, key):
            got = list(super().fetch(key))
            tell("fetched", len(got))
            yield from got

    def fake_github(owner, repo, artifact_name="hypothesis-example-db", **kw):
        tell("opened", owner, repo, artifact_name)
        return SharedStandIn(str(a_db))

    monkeypatch.setattr(hdb, "GitHubArtifactDatabase", fake_github)
    b_db, out = tmp_path / "b-db", tmp_path / "b.json"
    # --until-failure: the replayed counterexample ends the run (a 3 s budget made the verdict a race
    # between the worker's start and the deadline on a loaded machine)
    rc = fuzz.main(["mutant:foreign-free", "--seconds", "300", "--jobs", "1", "--until-failure",
                    "--capacity", str(16 * MiB),
                    "--db", str(b_db), "--db-readonly-github", "acme/memspec", "--db-artifact", "gpu-fuzz-db",
                    "--out", str(tmp_path / "b-repro"), "--quiet", "--json", str(out)])
    assert rc == 1
    import ast

    told = [ast.literal_eval(x) for x in said.read_text().splitlines()]
    assert ("opened", "acme", "memspec", "gpu-fuzz-db") in told
    assert any(t[0] == "fetched" and t[1] > 0 for t in told), "the shared counterexample was never read (reuse phase)"
    assert [f["invariant"] for f in json.loads(out.read_text())["failures"]] == ["S1"]
    assert _files(b_db), "the replayed counterexample was not saved locally"
    assert _files(a_db) == shared_before, "the shared (read-only) database was written"


def test_workflow_is_a_matrix_sharing_the_database():
    text = (ROOT / ".github" / "workflows" / "gpu-fuzz.yml").read_text()
    assert "matrix:" in text and "shard: [" in text
    assert "--db-readonly-github \"$GITHUB_REPOSITORY\"" in text and "--db-artifact gpu-fuzz-db" in text
    assert "SHARD * 1000000000" in text  # each shard its own seed range
    assert "gpu-fuzz-db-shard-${{ matrix.shard }}" in text
    assert "pattern: gpu-fuzz-db-shard-*" in text and "merge-multiple: true" in text and "name: gpu-fuzz-db\n" in text
    assert (ROOT / "docs" / "CAMPAIGNS.md").is_file()


@pytest.mark.parametrize("bad", ["nobody", "a/b/c", "/repo", "owner/", "own er/repo"])
def test_github_repo_flag_is_validated(bad):
    with pytest.raises(SystemExit):
        fuzz.parser().parse_args(["--db-readonly-github", bad])
