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


def _writable_ancestor(path: str) -> str | None:
    """The nearest existing ancestor directory of ``path`` if it is a writable
    directory, else None."""
    d = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent
    return d if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK) else None


def out_file(text: str) -> str:
    """A file the command can create or overwrite (its directory may be
    created): checked now, so an unwritable path fails before the run."""
    if not text:
        raise argparse.ArgumentTypeError("empty file name")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if os.path.exists(text):
        if not os.access(text, os.W_OK):
            raise argparse.ArgumentTypeError(f"{text} is not writable")
    elif _writable_ancestor(text) is None:
        raise argparse.ArgumentTypeError(f"cannot create {text}: its directory is missing or not writable")
    return text


def out_dir(text: str) -> str:
    """A directory the command can create or write into."""
    if not text:
        raise argparse.ArgumentTypeError("empty directory name")
    if os.path.exists(text):
        if not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
        if not os.access(text, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"directory {text} is not writable")
    elif _writable_ancestor(os.path.join(text, "x")) is None:
        raise argparse.ArgumentTypeError(f"cannot create directory {text}: its parent is missing or not writable")
    return text


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
