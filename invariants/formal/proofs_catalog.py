"""Every Z3 proof of the project, in one list: the seed-000 encodings
(:mod:`memspec.invariants.formal.proofs_seed000`) on the engine of
:mod:`memspec.invariants.formal.proofs`.  The engine imports no encoding, so no
import cycle; ``memspec prove`` reads the list from here."""

from __future__ import annotations

from typing import Any

from memspec.invariants.formal.proofs import Proof
from memspec.invariants.formal.proofs_seed000 import MORE_PROOFS, PROOFS


def all_proofs() -> list[Proof]:
    return list(PROOFS) + list(MORE_PROOFS)


# --------------------------------------------------------------------------
# Coverage: every spec action that declares an invariant is encoded
# --------------------------------------------------------------------------

def machines() -> dict[str, Any]:
    """The spec's machines by level name (their action tables are the source of truth)."""
    from memspec.spec.caching import CACHING
    from memspec.spec.mechanism import MECHANISM
    from memspec.spec.system import SYSTEM

    return {"mechanism": MECHANISM, "system": SYSTEM, "caching": CACHING}


def declared(inv_id: str) -> list[str]:
    """``level:action`` for every spec action whose ``invariants`` name ``inv_id``."""
    return sorted(f"{lvl}:{a.name}" for lvl, m in machines().items() for a in m.actions if inv_id in a.invariants)


def encoded(p: Proof) -> list[str]:
    """The spec actions ``p``'s machine encodes; a name the spec's tables do
    not have is an error (an encoding of nothing)."""
    known = {f"{lvl}:{a.name}" for lvl, m in machines().items() for a in m.actions}
    out: set[str] = set()
    for a in p.actions:
        for name in a.spec:
            if name not in known:
                raise ValueError(f"{p.id}: encoded action {a.name} names {name}, which no spec machine has")
            out.add(name)
    return sorted(out)
