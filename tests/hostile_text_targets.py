"""Hostile *text* from targets: exception messages that are not safe to print.

Each factory builds the toy target of :mod:`tests.hostile_targets` whose
``allocate`` raises, from its first call on, an exception (not an error of the
contract) carrying hostile text:

* ``toy_surrogate``    -- a lone surrogate (``"\\ud800"``): not encodable as UTF-8;
* ``toy_huge``         -- a message of ``HUGE_CHARS`` characters;
* ``toy_escapes``      -- ANSI CSI/OSC sequences, BEL, ``\\r``, other C0/C1
  controls, a backspace, a NUL, a DEL;
* ``toy_str_raises``   -- an exception whose ``__str__`` raises;
* ``toy_repr_raises``  -- an exception whose ``__str__`` *and* ``__repr__`` raise;
* ``toy_markup``       -- rich console markup and HTML/XML metacharacters.

Named on a command line as ``tests.hostile_text_targets:NAME`` with
``--machine tests.hostile_targets:TOY``.
"""

from __future__ import annotations

from memspec.spec import api
from tests.hostile_targets import TOY_CAPACITY, ToyAllocator, ToyEP, ToyMechanism

import os

#: the size of ``toy_huge``'s message (characters); ``MEMSPEC_HOSTILE_HUGE_CHARS`` overrides it
HUGE_CHARS = int(os.environ.get("MEMSPEC_HOSTILE_HUGE_CHARS") or 48_000_000)

SURROGATE_TEXT = "before \ud800 after \udfff end"
ESCAPE_TEXT = ("csi:\x1b[31mRED\x1b[0m osc:\x1b]0;pwned-title\x07 bel:\x07 cr:\rOVERWRITE "
               "c1:\x9b2J nul:\x00 bs:\x08 del:\x7f vt:\x0b ff:\x0c esc8:\x1b8 nel:\x85 ls:\u2028 bidi:\u202e end")
MARKUP_TEXT = "[bold red]markup[/] </failure><script>alert(1)</script> & \"q\" ]]> end"


class HostileStrError(Exception):
    """``str()`` of it raises."""

    def __str__(self):
        raise RuntimeError("__str__ of the target's exception exploded")


class HostileReprError(HostileStrError):
    """``str()`` and ``repr()`` of it raise."""

    def __repr__(self):
        raise RuntimeError("__repr__ of the target's exception exploded")


class _TextAllocator(ToyAllocator):
    make_error = staticmethod(lambda: KeyError("unset"))

    def allocate(self, request):
        raise self.make_error()


def _text(make_error):
    def factory(capacity=None):
        ep = ToyEP()
        alloc = _TextAllocator(ep)
        alloc.make_error = make_error
        return api.TargetInstance(mechanism=ToyMechanism(alloc), ep=ep, capacity=capacity or TOY_CAPACITY)
    return factory


toy_surrogate = _text(lambda: RuntimeError(SURROGATE_TEXT))
toy_huge = _text(lambda: RuntimeError("H" * HUGE_CHARS))
toy_escapes = _text(lambda: RuntimeError(ESCAPE_TEXT))
toy_str_raises = _text(HostileStrError)
toy_repr_raises = _text(HostileReprError)
toy_markup = _text(lambda: RuntimeError(MARKUP_TEXT))
