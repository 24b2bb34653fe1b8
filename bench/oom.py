"""Benchmark: ``memspec oom explain`` on pasted logs of 50 MB (issue 17: answered in < 2 s).

Four 50 MB inputs, each ending with a real-format OOM message: a training
log (ordinary lines), a run of digits (the quadratic case of issue 15 item
9), a log whose every line mentions GPU memory, and nothing but OOM messages
back to back (the parser reads the first MiB of message text closely and
counts the rest).  The figure is the
wall time of parse + triage; the ratio compares it with one C-level pass over
the same bytes (``bytes.count``) measured in the same run.
"""

from __future__ import annotations

import time

from bench.common import Row

MB = 1_000_000
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "39.39 GiB of which 1.10 GiB is free. Process 23187 has 27.30 GiB memory in use. Of the allocated memory "
       "8.10 GiB is allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.\n")


def inputs(size: int) -> dict[str, bytes]:
    log = b"2026-01-01 12:00:00 INFO step 1234 loss 0.1234 lr 3e-4 throughput 123.4 samples/s grad_norm 1.02\n"
    mem = b"step 1234 gpu memory in use 22.31 GiB, reserved 23.00 GiB, allocated 21.90 GiB (free 0.35 GiB)\n"
    tail = OOM.encode()
    return {
        "training log": log * ((size - len(tail)) // len(log)) + tail,
        "digits": b"7" * (size - len(tail) - 1) + b"\n" + tail,
        "memory on every line": mem * ((size - len(tail)) // len(mem)) + tail,
        "OOM messages back to back": tail * (size // len(tail)),
    }


def run(quick: bool = False) -> list[Row]:
    from memspec.triage import oom as lib

    size = 2 * MB if quick else 50 * MB
    rows = []
    for name, data in inputs(size).items():
        best = base = float("inf")
        for _ in range(1 if quick else 2):
            t0 = time.perf_counter()
            data.count(b"\n")
            base = min(base, time.perf_counter() - t0)
            t0 = time.perf_counter()
            f = lib.parse(data)
            v = lib.triage(f)
            best = min(best, time.perf_counter() - t0)
        assert v.cause == "other-processes", (name, v.cause)
        rows.append(Row(f"oom explain: {size // MB} MB {name}", best, "s", best / base if base else None,
                        "< 2 s", best < 2.0, f"verdict {v.cause}; ratio vs one bytes.count pass"))
    return rows


def corpus_rows(quick: bool = False) -> list[Row]:
    """Quality on the public corpus (tests/data/oom/corpus.json): figures read, cause, first next step --
    for all messages and for the held-out part apart.  Printed, never asserted on time."""
    import pathlib
    import sys

    tests = pathlib.Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests))
    try:
        import oom_corpus
    finally:
        sys.path.remove(str(tests))
    t0 = time.perf_counter()
    rows, s = oom_corpus.score()
    took = time.perf_counter() - t0
    h = s["held_out"]
    out = []
    for key, label, target in (("parsed", "figures read", 0.95), ("cause", "cause = thread's", 0.90),
                               ("first_step", "first step = thread's fix", 0.80)):
        # ratio: the score over its target, measured in this run (>= 1: met)
        out.append(Row(f"oom corpus: {label} ({s['messages']} msgs, {s['stacks']} stacks)", 100 * s[key], "%",
                       s[key] / target,
                       f">= {target:.0%}", s[key] >= target,
                       f"held out ({h['n']}): {100 * h[key]:.0f}%; scored in {took:.2f} s"))
    return out


def run_all(quick: bool = False) -> list[Row]:
    return corpus_rows(quick) + run(quick)


if __name__ == "__main__":
    for r in corpus_rows():
        print(f"{r.name}: {r.value:.1f}% (target {r.target}) met={r.met} {r.note}")
    for r in run():
        print(f"{r.name}: {r.value:.3f} s (x{r.ratio:.0f} a bytes.count pass) met={r.met}")
