"""Score memspec's OOM triage on the corpus of real messages (tests/data/oom/corpus.json).

Used by tests/test_oom_corpus.py and runnable on its own (``python tests/oom_corpus.py``)
to print the table.  The expected figures are written as the message prints them
("20.00 MiB"); they are converted here, independently of the parser, and a parsed
figure counts when it is within the printed rounding (half a unit of the last digit).
"""

from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass

from memspec.triage import oom as lib

CORPUS = pathlib.Path(__file__).parent / "data" / "oom" / "corpus.json"

_UNITS = {"bytes": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}

#: what the first next step must talk about, per cause (the thread's cause)
FIRST_STEP = {
    "does-not-fit": ("batch", "shrink", "smaller", "chunk"),
    "fragmentation": ("expandable_segments", "max_split_size"),
    "other-processes": ("nvidia-smi", "co-tenant"),
    "nccl": ("nccl",),
    "graph-pools": ("graph",),
    "cudnn-workspace": ("cudnn",),
    "driver-reserve": ("reserve", "driver"),
    "memory-fraction": ("fraction", "allowed"),
    "framework-preallocation": ("allow_growth", "memory_growth", "XLA_PYTHON_CLIENT"),
    "stream-events": ("synchronize",),
    "own-ranks": ("set_device",),
    "leak": ("accumulat",),
    "host-memory": ("RAM", "host"),
}

_FLAGS = {"--cuda-graphs": "cuda_graphs", "--distributed": "distributed", "--cudnn-benchmark": "cudnn_benchmark"}


def printed(s: str) -> tuple[float, float]:
    """'20.00 MiB' -> (bytes, tolerance): half a unit of the last printed digit, at least 1 byte."""
    m = re.fullmatch(r"([0-9]+)(?:\.([0-9]+))?\s*(bytes|KiB|MiB|GiB|TiB)", s.strip())
    if not m:
        raise ValueError(f"bad expected figure {s!r}")
    unit = _UNITS[m.group(3)]
    decimals = len(m.group(2) or "")
    value = float(m.group(1) + ("." + m.group(2) if m.group(2) else "")) * unit
    return value, max(1.0, 0.5 * unit / 10 ** decimals)


@dataclass
class Row:
    id: str
    basis: str
    parsed_ok: bool
    misread: list[str]
    cause: str
    got: str
    first_ok: bool
    first_step: str
    stack: str = ""
    held_out: bool = False


def score_entry(e: dict) -> Row:
    f = lib.parse(e["message"])
    misread = []
    for k, v in e["expected"].items():
        if k == "processes":
            want = [(pid, printed(s)) for pid, s in v]
            got = f.process_lines
            if len(got) != len(want) or any(gp != wp or abs(gu - wv) > tol
                                            for (gp, gu), (wp, (wv, tol)) in zip(got, want)):
                misread.append(f"processes {got} != {v}")
            continue
        value, tol = printed(v)
        g = getattr(f, k)
        if k in f.derived:
            g = None   # a figure the message prints must be read, not derived
        if g is None or abs(g - value) > tol:
            misread.append(f"{k}={g} != {v}")
    flags = {_FLAGS[x]: True for x in e.get("flags", [])}
    v = lib.triage(f, **flags)
    first = v.next_steps[0] if v.next_steps else ""
    want_words = e.get("first_step") or FIRST_STEP.get(e["cause"], ())   # the thread's own fix, when given
    first_ok = any(w.lower() in first.lower() for w in want_words)
    return Row(e["id"], e["basis"].split(":")[0], not misread, misread, e["cause"], v.cause, first_ok, first,
               e.get("stack", ""), bool(e.get("held_out")))


def _part(rows: list[Row]) -> dict[str, float]:
    n = len(rows) or 1
    return {"n": len(rows), "parsed": sum(r.parsed_ok for r in rows) / n, "cause": sum(r.got == r.cause for r in rows) / n,
            "first_step": sum(r.first_ok for r in rows) / n}


def score(entries: list[dict] | None = None) -> tuple[list[Row], dict[str, float]]:
    entries = entries if entries is not None else json.loads(CORPUS.read_text())
    rows = [score_entry(e) for e in entries]
    n = len(rows)
    summary = {"messages": n,
               "parsed": sum(r.parsed_ok for r in rows) / n,
               "cause": sum(r.got == r.cause for r in rows) / n,
               "first_step": sum(r.first_ok for r in rows) / n,
               "stacks": len({r.stack for r in rows if r.stack})}
    for basis in ("thread", "inferred"):
        sub = [r for r in rows if r.basis == basis]
        summary[f"{basis}_n"] = len(sub)
        summary[f"{basis}_cause"] = sum(r.got == r.cause for r in sub)
    summary["held_out"] = _part([r for r in rows if r.held_out])
    summary["tuned"] = _part([r for r in rows if not r.held_out])
    return rows, summary


def table(rows: list[Row], summary: dict[str, float], *, show_held_out: bool = True) -> str:
    lines = [f"{'id':<26} {'stack':<18} {'basis':<9} {'parsed':<7} {'thread cause':<24} {'triage':<26} first-step"]
    for r in rows:
        if r.held_out and not show_held_out:
            continue
        lines.append(f"{r.id:<26} {r.stack:<18} {r.basis:<9} {'yes' if r.parsed_ok else 'NO':<7} {r.cause:<24} "
                     f"{r.got + ('' if r.got == r.cause else ' X'):<26} {'yes' if r.first_ok else 'NO'}"
                     + (" (held out)" if r.held_out else "")
                     + ("" if r.parsed_ok else f"   misread: {'; '.join(r.misread)}"))
    h, t = summary["held_out"], summary["tuned"]
    lines.append(f"{summary['messages']} messages, {summary['stacks']} stacks: figures {summary['parsed']:.0%}, "
                 f"cause {summary['cause']:.0%}, first step {summary['first_step']:.0%}; "
                 f"held out ({h['n']}): figures {h['parsed']:.0%}, cause {h['cause']:.0%}, first step "
                 f"{h['first_step']:.0%}; tuned ({t['n']}): figures {t['parsed']:.0%}, cause {t['cause']:.0%}, "
                 f"first step {t['first_step']:.0%}; cause where the thread established it "
                 f"{summary['thread_cause']}/{summary['thread_n']}, where inferred {summary['inferred_cause']}/"
                 f"{summary['inferred_n']}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    rows, summary = score()
    print(table(rows, summary, show_held_out="--held-out" in sys.argv))
