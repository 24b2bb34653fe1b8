"""Score the OOM triage on real messages from public issues (tests/data/oom/corpus.json).

Prints the per-message table (``pytest -s`` shows it) and holds issue 17's
targets: >= 95% of messages parsed (every printed figure read within rounding),
>= 85% triaged to the cause the thread established, the first next step
consistent with that cause in >= 85%.
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import oom_corpus  # noqa: E402

ENTRIES = json.loads(oom_corpus.CORPUS.read_text())


def test_corpus_is_real_and_complete():
    assert len(ENTRIES) >= 30
    ids = [e["id"] for e in ENTRIES]
    assert len(set(ids)) == len(ids)
    for e in ENTRIES:
        assert e["source"].startswith("https://"), e["id"]
        assert e["cause"] in oom_corpus.lib.CAUSES and e["cause"] != "unknown", e["id"]
        assert e["basis"].startswith(("thread:", "inferred:")), e["id"]


def test_corpus_score():
    rows, summary = oom_corpus.score(ENTRIES)
    print("\n" + oom_corpus.table(rows, summary))
    assert summary["parsed"] >= 0.95
    assert summary["cause"] >= 0.85
    assert summary["first_step"] >= 0.85


def test_scorer_can_fail():
    """A wrong expected figure and a wrong cause are counted as misses."""
    e = dict(ENTRIES[0])
    e["expected"] = dict(e["expected"], requested="99.00 MiB")
    e["cause"] = "nccl"
    row = oom_corpus.score_entry(e)
    assert not row.parsed_ok and row.got != row.cause and not row.first_ok
