"""The example database of ``memspec fuzz``: a local directory (writes
checked: a full disk is counted, never silent), optionally joined read-only
with a GitHub artifact.  Part of :mod:`memspec.invariants.fuzz`."""

from __future__ import annotations

import mmap

def open_database(db: str | None, github: str | None = None, artifact: str = "hypothesis-example-db"):
    """The example database: the local directory ``db``, and with ``github``
    (``OWNER/REPO``) that repository's artifact read-only in front of it.
    Saves go to the local directory only."""
    from hypothesis.database import MultiplexedDatabase, ReadOnlyDatabase

    local = _CheckedDatabase(db) if db else None
    if not github:
        return local
    from hypothesis.database import GitHubArtifactDatabase

    owner, repo = github.split("/")
    shared = ReadOnlyDatabase(GitHubArtifactDatabase(owner, repo, artifact_name=artifact))
    return MultiplexedDatabase(local, shared) if local is not None else shared


def _checked_database_class():
    from hypothesis.database import DirectoryBasedExampleDatabase

    class CheckedDatabase(DirectoryBasedExampleDatabase):
        """Hypothesis's directory database, which swallows every ``OSError`` of a
        save (a full disk persists nothing, silently): each save is checked by
        reading the value back, and the saves that did not persist are counted
        (``lost``, in shared memory: the children save) so the command can say so."""

        def save(self, key: bytes, value: bytes) -> None:
            super().save(key, value)
            try:
                kept = value in set(self.fetch(key))
            except Exception:  # noqa: BLE001
                kept = False
            if not kept:
                _LOST.add()

    return CheckedDatabase


class _Counter:
    """An int in memory shared with the forked children."""

    def __init__(self) -> None:
        self.mem = mmap.mmap(-1, 8)

    def add(self, n: int = 1) -> None:
        self.mem[0:8] = (self.value() + n).to_bytes(8, "little")

    def value(self) -> int:
        return int.from_bytes(self.mem[0:8], "little")

    def set(self) -> None:
        self.add(1)

    def is_set(self) -> bool:
        return self.value() > 0


_LOST = _Counter()
_CHECKED = None


def _CheckedDatabase(path: str):  # noqa: N802 - a class made on first use (Hypothesis is imported late)
    global _CHECKED
    if _CHECKED is None:
        _CHECKED = _checked_database_class()
    return _CHECKED(path)


def lost_saves() -> int:
    """Saves to ``--db`` (by this process and its children) that did not persist."""
    return _LOST.value()
