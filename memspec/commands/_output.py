"""Writing a command's outputs after its run: each output on its own, a
failure (a full disk, a directory removed during the run) said in one line
on stderr, and the other outputs still written.

Not a subcommand: the helpers the commands share (``memspec.cli`` lists
only the subcommands).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from memspec.invariants import text as T


def reason(e: BaseException) -> str:
    """One line for why a write failed: ``No space left on device [Errno 28]``."""
    if isinstance(e, OSError) and e.strerror:
        return f"{T.safe_str(e.strerror, 200)} [Errno {e.errno}]"
    return T.exc_text(e, 300)


def say(line: str) -> None:
    """One line on stderr, its control characters shown escaped; never raises
    (stderr itself may be gone)."""
    try:
        print(T.terminal(line, 1000), file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001
        pass


def write_output(prog: str, flag: str, path: Any, write: Callable[[], Any]) -> bool:
    """Run ``write()``; on any failure say ``PROG: cannot write FLAG PATH:
    WHY`` in one line and return False (the caller goes on with its other
    outputs)."""
    try:
        write()
        return True
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - one output's failure never loses the others
        say(f"{prog}: cannot write {flag} {T.safe_str(path, 500)}: {reason(e)}")
        return False


class Terminal:
    """The report's console output, guarded: if stdout cannot be written
    (``> /dev/full``, a closed pipe) the first failure is said once on
    stderr, stdout is pointed at ``/dev/null`` (so the interpreter's final
    flush cannot fail again) and the command goes on to write its files."""

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self.failed = False

    def run(self, fn: Callable[[], Any]) -> None:
        if self.failed:
            return
        try:
            fn()
            sys.stdout.flush()
        except OSError as e:
            self.failed = True
            say(f"{self.prog}: cannot write the report to stdout: {reason(e)}")
            _stdout_to_devnull()


def _stdout_to_devnull() -> None:
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(fd, sys.stdout.fileno())
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - not a real file (captured): nothing to protect
        pass
