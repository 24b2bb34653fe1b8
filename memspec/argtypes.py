"""argparse types for memspec's commands: a bad flag is refused while the
command line is parsed (usage + message, exit status 2), before any run --
never silently replaced by a default, and never left to fail inside the
harness where it would look like the target's fault.

Output paths are checked the same way: a file or directory the run could not
write is an error up front, not a traceback after the whole run.
"""

from __future__ import annotations

import argparse
import math
import os


def _number(kind, text: str):
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (examples, steps, capacity, samples)."""
    v = _number(int, text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return v


def non_negative_int(text: str) -> int:
    """An integer >= 0 (a threshold that 0 switches off)."""
    v = _number(int, text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {v}")
    return v


def invariant_id(text: str) -> str:
    """An invariant's id as the report names it: letters then digits (S11, C6, T1)."""
    import re

    t = text.strip()
    if not re.fullmatch(r"[A-Z]{1,3}[0-9]{1,3}", t):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an invariant id (letters then digits, e.g. S11 or C6)")
    return t


def seconds(text: str) -> float:
    """A finite number of seconds > 0 and at most a year (a per-call timeout,
    a time budget): 0, negatives, nan and inf are refused."""
    v = _number(float, text)
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    if v > 365 * 86400:
        raise argparse.ArgumentTypeError(f"must be at most a year (31536000 s), got {text!r}")
    return v


def minutes(text: str) -> float:
    """A finite number of minutes > 0 (a fuzz budget)."""
    v = seconds(text)
    if v * 60 > 365 * 86400:
        raise argparse.ArgumentTypeError(f"must be at most a year, got {text!r} minutes")
    return v


def _nearest_existing(path: str) -> str:
    """``path`` itself if it exists, else its nearest existing ancestor."""
    d = os.path.abspath(path)
    while not os.path.lexists(d):
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return d


def _probe_dir(d: str) -> str | None:
    """None if a file can really be created in directory ``d``, else why not.

    ``os.access`` is not enough: it says yes to root on a read-only
    directory and on file systems that refuse writes (``/sys``, a read-only
    mount), so a file is created (``O_CREAT | O_EXCL``) and removed."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".memspec-probe-", dir=d)
    except OSError as e:
        return e.strerror or type(e).__name__
    try:
        os.close(fd)
    finally:
        try:
            os.unlink(name)
        except OSError:
            pass
    return None


def _check_creatable(text: str, what: str) -> None:
    """``text`` does not exist: its nearest existing ancestor must be a
    directory a file can be created in (the missing directories are created
    when the output is written)."""
    anc = _nearest_existing(os.path.dirname(os.path.abspath(text)))
    if not os.path.isdir(anc):
        raise argparse.ArgumentTypeError(f"cannot create {what} {text}: not writable ({anc} is not a directory)")
    why = _probe_dir(anc)
    if why is not None:
        raise argparse.ArgumentTypeError(f"cannot create {what} {text}: directory {anc} is not writable ({why})")


def out_file(text: str) -> str:
    """A file the command can create or overwrite (its missing directories
    are created when it is written): checked now by really creating a file
    beside it, so an unwritable path -- a read-only or missing-and-uncreatable
    directory, a path under a file, a directory -- fails before the run."""
    if not text:
        raise argparse.ArgumentTypeError("empty file name")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a file name cannot contain a NUL character")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if os.path.lexists(text):
        import stat

        try:
            st = os.stat(text)
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{text} is not writable ({e.strerror})") from None
        if stat.S_ISREG(st.st_mode):
            try:   # opened for appending: nothing in it changes
                os.close(os.open(text, os.O_WRONLY | os.O_APPEND))
            except OSError as e:
                raise argparse.ArgumentTypeError(f"{text} is not writable ({e.strerror})") from None
        elif not os.access(text, os.W_OK):   # a device or a pipe (/dev/stdout): never opened here
            raise argparse.ArgumentTypeError(f"{text} is not writable")
        return text
    _check_creatable(text, "file")
    return text


def out_dir(text: str) -> str:
    """A directory the command can create or write into (a file is really
    created in it, or in its nearest existing ancestor, and removed)."""
    if not text:
        raise argparse.ArgumentTypeError("empty directory name")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a directory name cannot contain a NUL character")
    if os.path.exists(text):
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
        why = _probe_dir(text)
        if why is not None:
            raise argparse.ArgumentTypeError(f"directory {text} is not writable ({why})")
        return text
    _check_creatable(text, "directory")
    return text


def max_jobs() -> int:
    """The most worker processes ``--jobs`` accepts: 4 x the cores this
    process may run on, at most 256."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(256, 4 * max(1, cores)))


def jobs(text: str) -> int:
    """A number of worker processes: 1 .. :func:`max_jobs` (a typo such as
    ``--jobs 10000`` would fork ten thousand processes)."""
    v = positive_int(text)
    cap = max_jobs()
    if v > cap:
        raise argparse.ArgumentTypeError(f"must be at most {cap} (4 x the cores available, at most 256), got {v}")
    return v


class TargetParser(argparse.ArgumentParser):
    """A parser with a positional ``target`` and a ``--target`` alias
    (``dest="target_opt"``): giving both with different values is an error,
    not a silent choice of one."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns = super().parse_args(args, namespace)
        a, b = getattr(ns, "target", None), getattr(ns, "target_opt", None)
        if a is not None and b is not None and a != b:
            self.error(f"two different targets given: positional {a!r} and --target {b!r}")
        return ns
