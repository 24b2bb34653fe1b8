"""The seeded spec-only walks of seed 000's machines: one table for the formal side.

Proof coverage (:func:`memspec.invariants.formal.coverage.derive`: what each branch writes, what each
invariant reads), encoding agreement (:func:`memspec.invariants.formal.agreement_adapters.run_all`:
``memspec prove``'s transition and invariant agreement) and the self-test's agreement detector
(:func:`memspec.invariants.formal.proofs_selftest.detect_agreement`) all walk the machines of this
table, each step drawn and followed by :mod:`memspec.spec.selfcheck` (:func:`~memspec.spec.selfcheck.pick_action`,
:func:`~memspec.spec.selfcheck.draw_branch`, :func:`~memspec.spec.selfcheck.follow`).  A walk is a
machine (``level``), its init keywords, the actions it draws from (``focus``: a subset, whose states
are reachable in the whole machine; empty: all), and what each user takes from it: coverage its
``steps``; agreement its adapters and sample share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

PAGE = 4096
#: every walk restarts from its initial state every ``RESTART`` steps (agreement: sooner, past its
#: universe's bounds)
RESTART = 60


@dataclass(frozen=True)
class Walk:
    """One seeded walk of the table (see the module)."""

    name: str
    level: str                       # "mechanism" or "system"
    init: dict
    focus: tuple[str, ...] = ()
    #: coverage: the steps walked (0: not a coverage walk)
    steps: int = 0
    #: agreement: the adapter list (``"MECH"``, ``"SYS"``, ``"SMALL"``, ``"TICKET"``: ``MECH_ADAPTERS``...
    #: of :mod:`~memspec.invariants.formal.agreement_adapters`) and which of its adapters (``None``: every
    #: one); no list: not an agreement walk
    adapters: str = ""
    which: Callable[[Any], bool] | None = None
    #: agreement: samples per adapter ``max(least, samples // div)``; the walk's seed ``seed + offset``;
    #: ``favour`` (:func:`agreement.walk_and_compare`); ``prior``: the walk counts what the walks
    #: without one sampled (those run first: focused walks reaching rare branches)
    div: int = 1
    least: int = 0
    offset: int = 0
    favour: float = 0.85
    prior: bool = False
    #: spec steps taken from the initial state before the walk (:func:`load_cold_weights`)
    setup: Callable[[Any], None] | None = None

    def samples(self, samples: int) -> int:
        return max(self.least, samples // self.div)


def start(walk: Walk) -> Any:
    """The walk's initial state: its machine's ``init``, then its ``setup``."""
    from memspec.invariants.formal.proofs_catalog import machines

    s = machines()[walk.level].init(**walk.init)
    if walk.setup is not None:
        walk.setup(s)
    return s


def load_cold_weights(s: Any) -> None:
    """ModelResidency loads two cold weights (spec steps, so the state is reachable): a holder then has
    bytes to release for a pressure ticket."""
    from memspec.spec.selfcheck import drive
    from memspec.spec.system import SYSTEM

    for name in ("w1", "w2"):
        drive(SYSTEM, s, "load_weight", weight=(name, False, s.weights[name].pages * s.page))


def _mech(vb: bool = True, sm: bool = True) -> dict:
    return dict(capacity=12 * PAGE, page=PAGE, virtual_backing=vb, shared_mapping=sm, ep=True)


def _sys(vb: bool = True, sm: bool = True, pages: int = 16) -> dict:
    return dict(capacity=pages * PAGE, page=PAGE, virtual_backing=vb, shared_mapping=sm)


#: the ticket protocol and what feeds it (weights to release): granted, claimed, failed tickets
TICKET_FOCUS = ("issue_ticket", "respond", "claim", "cancel_ticket", "expire", "reconfigure", "load_weight",
                "set_hot", "unload_weight")
#: coverage: KV requests (some sharing a prefix) grown, used, closed, their releases run
KV_FOCUS = ("kv_open", "kv_grow", "kv_use", "kv_close", "poll", "synchronize")
#: coverage: shared memory: handles mapped, written, copied on write, unmapped, released
SHARED_FOCUS = ("shared_reserve", "create", "map", "unmap", "free_shared_reservation", "copy_on_write",
                "write_through", "release_handle", "mapping_count")
#: agreement: a pressure ticket answered while releases wait on the queue, some behind fences not done
RESPOND_FOCUS = ("new_stream", "allocate_owned", "use", "drop", "load_weight", "set_hot", "kv_open", "kv_grow",
                 "kv_use", "kv_close", "issue_ticket", "respond", "synchronize")

#: Every walk, in coverage's order (its seeds follow it).  Coverage walks each machine under each
#: capability configuration (a roomy device and one of two pages), and focused walks of the protocols
#: whose deep states the whole machine reaches rarely (a reconfigure failing tickets that hold bytes, a
#: KV release run).  Agreement walks the full machines and, first, walks focused on the branches they
#: reach rarely: a KV prefix larger than what its origin committed (~3% of kv_open's draws), a KV
#: release run (~1 full-walk sample in 100), a response with releases queued, a shared reservation
#: freed while mapped; reservations past a small device (OutOfMemory; GrantDenied on commit_owned);
#: a mechanism without VirtualBacking or SharedMapping (the capability queries answer None).
WALKS: tuple[Walk, ...] = (
    Walk("mechanism", "mechanism", _mech(), steps=900, adapters="MECH", prior=True),
    Walk("mechanism-vb", "mechanism", _mech(True, False), steps=900),
    Walk("mechanism-sm", "mechanism", _mech(False, True), steps=900),
    Walk("bare-mechanism", "mechanism", _mech(False, False), steps=900, adapters="MECH",
         which=lambda a: a.invariant == "S5" and a.spec_action.startswith("query_"), div=8, least=20, offset=4),
    Walk("system", "system", _sys(), steps=1000, adapters="SYS", prior=True),
    Walk("system-vb", "system", _sys(True, False), steps=1000),
    Walk("system-sm", "system", _sys(False, True), steps=1000),
    Walk("system-bare", "system", _sys(False, False), steps=1000),
    Walk("small-system", "system", _sys(pages=2), steps=600, adapters="SMALL", div=8, least=20, offset=1),
    Walk("tickets-coverage", "system", _sys(), TICKET_FOCUS, steps=900),
    Walk("kv-coverage", "system", _sys(), KV_FOCUS, steps=750),
    Walk("shared-coverage", "mechanism", _mech(), SHARED_FOCUS, steps=600),
    Walk("kv-prefix", "system", _sys(), ("kv_open", "kv_grow", "kv_close"), adapters="SYS",
         which=lambda a: a.spec_action == "kv_open" and a.invariant in ("S5", "S12", "S13"),
         div=3, least=40, offset=2, favour=0.1),
    Walk("kv-release", "system", _sys(), ("kv_open", "kv_grow", "kv_close", "poll"), adapters="SYS",
         which=lambda a: a.spec_action == "poll" and (a.invariant, a.action) == ("S11", "kv_release"),
         div=40, least=8, offset=4),
    Walk("respond", "system", _sys(), RESPOND_FOCUS, adapters="SYS",
         which=lambda a: a.spec_action == "respond" and (a.invariant, a.action) == ("S4", "respond"),
         div=40, least=8, offset=5),
    Walk("shared", "mechanism", _mech(), ("shared_reserve", "create", "map", "unmap", "free_shared_reservation"),
         adapters="MECH", which=lambda a: a.spec_action == "free_shared_reservation" and a.invariant in ("S5", "S4"),
         div=8, least=20, offset=3, favour=0.1),
    # S15, G1 and S6 on the ticket protocol's actions, two cold weights loaded: granted tickets
    # (claim ok) are common
    Walk("tickets", "system", _sys(), TICKET_FOCUS, adapters="TICKET", offset=15, prior=True,
         setup=load_cold_weights),
)

BY_NAME: dict[str, Walk] = {w.name: w for w in WALKS}
