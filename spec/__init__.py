"""The executable spec of seed 000 (and seed 003's caching allocator).

Read in this order: :mod:`.api` and :mod:`.errors` (the contract),
:mod:`.core` (the grammar of actions, outcomes and invariants), then the role
modules, then :mod:`.invariants`.
"""
