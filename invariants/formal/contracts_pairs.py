"""Spec kernel / reference counterpart pairs for ``crosshair diffbehavior``.

Each pair is two functions with the same signature: ``spec_X`` runs the spec's
kernel (:mod:`memspec.spec.kernels`, :mod:`memspec.spec.caching`), ``ref_X``
runs the reference implementation's own code for the same figure.  Both
return ``None`` outside the kernel's domain (its PEP 316 preconditions), so
CrossHair compares them exactly where the spec makes a claim.

The reference Governor has no standalone ledger functions: ``ref_*`` ledger
adapters build a ``ReferenceGovernor`` and drive it *through its public
API* (reserve / commit / cancel / refund) to the given ledger, then perform
the operation and read ``ledger()`` back.  Refusals are compared by error
class (``GrantDenied``), so the decision rule is compared too.
"""

from __future__ import annotations

from typing import Optional

from memspec.spec import kernels as K
from memspec.spec.errors import GrantDenied

Ledger4 = Optional[tuple[int, int, int, int]]


# --------------------------------------------------------------------------
# page rounding: spec kernels.round_up vs reference.common.round_up
# --------------------------------------------------------------------------

def spec_round_up(n: int, page: int) -> Optional[int]:
    if page <= 0 or n < 0:
        return None
    return K.round_up(n, page)


def ref_round_up(n: int, page: int) -> Optional[int]:
    from memspec.reference.common import round_up

    if page <= 0 or n < 0:
        return None
    return round_up(n, page)


# --------------------------------------------------------------------------
# ledger arithmetic: spec kernels vs the reference Governor
# --------------------------------------------------------------------------

def _valid(free: int, granted: int, charged: int) -> bool:
    return free >= 0 and granted >= 0 and charged >= 0 and free + granted + charged > 0


def _ref_governor(free: int, granted: int, charged: int):  # type: ignore[no-untyped-def]
    """A reference Governor brought to the ledger (free, granted, charged)
    through its public API; returns it and the open grant (or None)."""
    from memspec.reference.governor import ReferenceGovernor

    gov = ReferenceGovernor(free + granted + charged)
    if charged:
        gov.commit(gov.reserve("charged", charged), charged)
    g = gov.reserve("granted", granted) if granted else None
    return gov, g


def spec_grant(free: int, granted: int, charged: int, n: int) -> Ledger4:
    if not _valid(free, granted, charged) or n <= 0:
        return None
    l = K.Ledger(free + granted + charged, free, granted, charged)
    if not K.can_grant(l, n):
        raise GrantDenied("not free")
    return tuple(K.grant(l, n))  # type: ignore[return-value]


def ref_grant(free: int, granted: int, charged: int, n: int) -> Ledger4:
    if not _valid(free, granted, charged) or n <= 0:
        return None
    gov, _ = _ref_governor(free, granted, charged)
    gov.reserve("h", n)
    return gov.ledger()


def spec_commit(free: int, granted: int, charged: int, actual: int) -> Ledger4:
    """Commit the whole open grant (``granted`` bytes) at ``actual`` bytes."""
    if not _valid(free, granted, charged) or granted <= 0 or actual < 0:
        return None
    l = K.Ledger(free + granted + charged, free, granted, charged)
    if not K.can_commit(l, granted, actual):
        raise GrantDenied("footprint larger than grant + free")
    return tuple(K.commit_grant(l, granted, actual))  # type: ignore[return-value]


def ref_commit(free: int, granted: int, charged: int, actual: int) -> Ledger4:
    if not _valid(free, granted, charged) or granted <= 0 or actual < 0:
        return None
    gov, g = _ref_governor(free, granted, charged)
    gov.commit(g, actual)
    return gov.ledger()


def spec_cancel(free: int, granted: int, charged: int) -> Ledger4:
    if not _valid(free, granted, charged) or granted <= 0:
        return None
    l = K.Ledger(free + granted + charged, free, granted, charged)
    return tuple(K.cancel_grant(l, granted))  # type: ignore[return-value]


def ref_cancel(free: int, granted: int, charged: int) -> Ledger4:
    if not _valid(free, granted, charged) or granted <= 0:
        return None
    gov, g = _ref_governor(free, granted, charged)
    gov.cancel(g)
    return gov.ledger()


def spec_refund(free: int, granted: int, charged: int, n: int) -> Ledger4:
    """Refund ``n`` bytes of the (single) lease holding the whole charge."""
    if not _valid(free, granted, charged) or not (0 <= n <= charged) or charged <= 0:
        return None
    l = K.Ledger(free + granted + charged, free, granted, charged)
    return tuple(K.refund(l, n))  # type: ignore[return-value]


def ref_refund(free: int, granted: int, charged: int, n: int) -> Ledger4:
    if not _valid(free, granted, charged) or not (0 <= n <= charged) or charged <= 0:
        return None
    from memspec.reference.governor import ReferenceGovernor

    gov = ReferenceGovernor(free + granted + charged)
    lease = gov.commit(gov.reserve("charged", charged), charged)
    if granted:
        gov.reserve("granted", granted)
    gov.refund(lease, n)
    return gov.ledger()


def spec_ticket_receive(free: int, granted: int, charged: int, n: int) -> Ledger4:
    """A pressure ticket receives ``n`` bytes a holder's releases refunded."""
    if not _valid(free, granted, charged) or not (0 <= n <= free):
        return None
    l = K.Ledger(free + granted + charged, free, granted, charged)
    return tuple(K.grant_from_free(l, n))  # type: ignore[return-value]


def ref_ticket_receive(free: int, granted: int, charged: int, n: int) -> Ledger4:
    if not _valid(free, granted, charged) or not (0 <= n <= free):
        return None
    gov, _ = _ref_governor(free, granted, charged)
    t = gov.issue_ticket("requester", n + 1)
    gov.respond(t, "holder", n)
    return gov.ledger()


def spec_ticket_cancel(free: int, granted: int, charged: int, n: int) -> Ledger4:
    """A ticket holding ``n`` bytes is cancelled: they go back to free."""
    if not _valid(free, granted, charged) or not (0 <= n <= free):
        return None
    l = K.grant_from_free(K.Ledger(free + granted + charged, free, granted, charged), n)
    return tuple(K.return_grant(l, n))  # type: ignore[return-value]


def ref_ticket_cancel(free: int, granted: int, charged: int, n: int) -> Ledger4:
    if not _valid(free, granted, charged) or not (0 <= n <= free):
        return None
    gov, _ = _ref_governor(free, granted, charged)
    t = gov.issue_ticket("requester", n + 1)
    gov.respond(t, "holder", n)
    gov.cancel_ticket(t)
    return gov.ledger()


def pairs_of(module: str, rows: tuple[tuple[str, str, str], ...]) -> list[tuple[str, str, str, str]]:
    """``(name, spec function, reference function, what is compared)`` of each row ``(name, X, what)``:
    the functions ``spec_X`` and ``ref_X`` of ``module`` (each pair module names its sides so)."""
    return [(name, f"{module}.spec_{x}", f"{module}.ref_{x}", what) for name, x, what in rows]


KERNEL_PAIRS: list[tuple[str, str, str, str]] = pairs_of(__name__, (
    ("round_up", "round_up", "kernels.round_up vs reference.common.round_up"),
    ("grant", "grant", "kernels.can_grant+grant vs ReferenceGovernor.reserve"),
    ("commit_grant", "commit", "kernels.can_commit+commit_grant vs ReferenceGovernor.commit"),
    ("cancel_grant", "cancel", "kernels.cancel_grant vs ReferenceGovernor.cancel"),
    ("refund", "refund", "kernels.refund vs ReferenceGovernor.refund"),
    ("grant_from_free", "ticket_receive", "kernels.grant_from_free vs ReferenceGovernor.respond"),
    ("return_grant", "ticket_cancel", "kernels.grant_from_free+return_grant vs ReferenceGovernor.respond+cancel_ticket"),
))


# --------------------------------------------------------------------------
# a deliberately different twin, for the self-test that diffbehavior can fail
# --------------------------------------------------------------------------

def mutant_round_up(n: int, page: int) -> Optional[int]:
    """round_up with the classic off-by-one (rounds exact multiples up too)."""
    if page <= 0 or n < 0:
        return None
    return (n // page + 1) * page


def all_pairs() -> tuple[list[tuple[str, str, str, str]], list[str]]:
    """Every pair (seed 000's kernels, then the caching allocator's), and a note for each kernel not diffed."""
    from memspec.invariants.formal import contracts_caching_pairs as cp

    return KERNEL_PAIRS + pairs_of(cp.__name__, cp.ROWS), list(cp.NOTES)
