"""Score the OOM triage on real messages from public issues (tests/data/oom/corpus.json).

Prints the per-message table (``pytest -s`` shows it) and holds issue 17's
targets: >= 95% of messages parsed (every printed figure read within rounding),
>= 90% triaged to the cause the thread established (issue 34), the first
next step consistent with that cause in >= 80%.
"""

from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import oom_corpus  # noqa: E402

ENTRIES = json.loads(oom_corpus.CORPUS.read_text())


def test_corpus_is_real_and_complete():
    assert len(ENTRIES) >= 40
    assert len({e["stack"] for e in ENTRIES}) >= 6
    assert any(e.get("held_out") for e in ENTRIES) and all(isinstance(e.get("held_out"), bool) for e in ENTRIES)
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
    assert summary["cause"] >= 0.90          # issue 34's target: 63/70 at the time of writing (bench row `oom`)
    assert summary["first_step"] >= 0.80


def test_every_named_format_has_a_real_message_that_is_read():
    """Issue 34: each format it names has a corpus message whose figures are read and which is triaged."""
    need = {"oom when allocating tensor": "tensorflow", "resource exhausted: oom when allocating": "tensorflow",
            "hip_error_outofmemory": "tensorflow-rocm", "would exceed allowed memory": "pytorch-cuda-async",
            "failed to cuda calloc": "nccl", "defaultcpuallocator": "host", "mps backend out of memory": "pytorch-mps",
            "hip out of memory": "pytorch-hip", "xpu out of memory": "pytorch-xpu", "bufferassignment": "jax",
            "could not create cudnn handle": "tensorflow", "cuda runtime error": "cuda-runtime",
            # allocator libraries
            "out of memory allocating": "cupy", "out of memory to allocate": "cupy",
            "cuda_memory_resource": "rmm", "maximum pool size exceeded": "rmm", "call to cumemalloc": "numba",
            "cudamalloc failed": "ggml", "no available memory for the cache blocks": "vllm",
            "gpu_memory_utilization (": "vllm"}
    for lit, stack in need.items():
        hits = [e for e in ENTRIES if lit in e["message"].lower()]
        assert hits, lit
        for e in hits:
            row = oom_corpus.score_entry(e)
            assert row.parsed_ok, (e["id"], row.misread)
        assert any(oom_corpus.lib.parse(e["message"]).stack == stack for e in hits), (lit, stack)


def test_scorer_can_fail():
    """A wrong expected figure and a wrong cause are counted as misses."""
    e = dict(ENTRIES[0])
    e["expected"] = dict(e["expected"], requested="99.00 MiB")
    e["cause"] = "nccl"
    row = oom_corpus.score_entry(e)
    assert not row.parsed_ok and row.got != row.cause and not row.first_ok
