"""Every Z3 proof of the project, in one list: the seed-000 encodings
(:mod:`memspec.invariants.proofs_seed000`) on the engine of
:mod:`memspec.invariants.proofs`.  The engine imports no encoding, so no
import cycle; ``memspec prove`` reads the list from here."""

from __future__ import annotations

from memspec.invariants.proofs import Proof, ProofResult, prove
from memspec.invariants.proofs_seed000 import PROOFS


def all_proofs() -> list[Proof]:
    return list(PROOFS)


def run_all(ids: list[str] | None = None) -> list[ProofResult]:
    return [prove(p) for p in all_proofs() if ids is None or p.id in ids]
