"""Run a caching-heap consecution in a fresh interpreter.

Z3's search depends on the ids of the terms already made in its (global)
context: the same consecution query that takes 5 s in a fresh process took
811 s in a pytest-xdist worker after other proof tests had filled the
context (grouped queries ran into their timeouts, then every goal was
re-checked alone).  A proof's *verdict* does not depend on that, its cost
does; the parametrized consecution tests therefore run each query where
nothing else has been built, as ``memspec prove`` runs its units.
"""

from __future__ import annotations

import json
import subprocess
import sys

_CODE = r"""
import json, sys
from memspec.invariants import proofs_caching_heap as H
a = json.loads(sys.argv[1])
acts = H.actions(frozenset(a["guards"])) + (H.phase_actions() if a["phase"] else [])
act = next(x for x in acts if x.name == a["action"])
print(json.dumps(H.consecution(act, timeout_ms=a["timeout_ms"], only=tuple(a["only"]))))
"""


def consecution(action: str, *, timeout_ms: int = 60000, phase: bool = False, guards: tuple[str, ...] = (),
                only: tuple[str, ...] = ()) -> list[tuple[str, str, float]]:
    """``proofs_caching_heap.consecution`` of the named action, in a fresh interpreter."""
    arg = json.dumps({"action": action, "timeout_ms": timeout_ms, "phase": phase, "guards": list(guards),
                      "only": list(only)})
    p = subprocess.run([sys.executable, "-c", _CODE, arg], capture_output=True, text=True, timeout=800)
    assert p.returncode == 0, p.stderr[-3000:]
    return [tuple(x) for x in json.loads(p.stdout.strip().splitlines()[-1])]
