"""The one sanitizer for text that came from a target (or a plugin).

A target's exception message, the repr of an object it returned, a name it
chose: all of it is untrusted text that ends up on a terminal, in JSON, in
JUnit XML, in HTML and in reproduction files.  It may be

* **undecodable** -- a lone surrogate (``"\\ud800"``) cannot be encoded as
  UTF-8, so writing it crashes the report (``UnicodeEncodeError``);
* **huge** -- tens of megabytes of exception text stall a table renderer for
  minutes and fill reports;
* **hostile to a terminal** -- ANSI CSI/OSC sequences, BEL, ``\\r``, other
  C0/C1 controls, bidi overrides redraw, retitle or hide what the terminal
  shows;
* **hostile to Python** -- an exception whose ``__str__`` (or ``__repr__``)
  raises.

Every function here never raises and costs time bounded by its ``limit``,
not by the length of the input: a huge string is cut by slicing (the head
and the tail are kept, with a note ``... [cut: N of M chars] ...`` between
them) before anything looks at its characters -- no regular expression
or translation ever runs over the whole of it.

Layers: :func:`safe_str` / :func:`exc_text` / :func:`safe_repr` give a plain,
bounded, encodable ``str`` (the data form, written to JSON and repro files as
escaped data); :func:`terminal` additionally shows every control character
escaped (``\\x1b``, ``\\r``, ``\\u202e``) for a console; :func:`xml` escapes
what XML 1.0 forbids.  HTML escaping of the data form is the report's own
(``html.escape``).  :func:`clean_results` applies :func:`safe_str` once to
every target-derived string of a run's results, where they enter the
reporting layer.
"""

from __future__ import annotations

from typing import Any

#: the longest text kept from one message (characters): the head and the tail of anything longer
MAX_CHARS = 8192
#: the longest text kept from one message on a terminal
TERMINAL_CHARS = 2000


def cut(s: str, limit: int = MAX_CHARS) -> str:
    """``s`` if it has at most ``limit`` characters, else its head and tail
    around a note of how much was cut.  Time O(limit), whatever len(s)."""
    n = len(s)
    if n <= limit:
        return s
    tail = max(limit // 4, 0)
    head = max(limit - tail, 0)
    total = n
    if n <= 4 * MAX_CHARS:   # cut again (a terminal's shorter limit): say the original length, not this one's
        at = s.find(_NOTE)
        if at >= 0:
            end = s.find(" chars]", at, at + 80)
            of = s.rfind(" of ", at, end) if end > 0 else -1
            digits = s[of + 4:end].replace(",", "") if of > 0 else ""
            if digits.isdigit():
                total = max(n, int(digits))
    return f"{s[:head]}{_NOTE}{total - head - tail:,} of {total:,} chars] ... {s[n - tail:] if tail else ''}"


_NOTE = " ... [cut: "


def _plain(s: Any) -> str:
    """An exact ``str`` (a str subclass may override slicing or ``__len__``)."""
    return s if type(s) is str else str.__str__(s)


def _encodable(s: str) -> str:
    """``s`` with lone surrogates (and anything else UTF-8 cannot encode)
    written as backslash escapes: ``"\\ud800"`` becomes the six characters
    ``\\ud800``."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def safe_str(obj: Any, limit: int = MAX_CHARS) -> str:
    """``str(obj)`` as plain, bounded, UTF-8-encodable text; never raises.
    When ``str()`` raises, ``repr()`` is tried, then a placeholder that names
    the type and what ``__str__`` raised."""
    try:
        s = obj if isinstance(obj, str) else str(obj)
        s = _plain(s)
    except Exception as e:  # noqa: BLE001 - a hostile __str__
        try:
            s = _plain(repr(obj))
        except Exception:  # noqa: BLE001 - a hostile __repr__ too
            s = f"<{_type_name(obj)} object: its __str__ raised {_type_name(e)}>"
        else:
            s = f"{cut(s, limit)} (its __str__ raised {_type_name(e)})"
    return _encodable(cut(s, limit))


def safe_repr(obj: Any, limit: int = MAX_CHARS) -> str:
    """``repr(obj)`` as plain, bounded text; never raises."""
    try:
        s = _plain(repr(obj))
    except Exception as e:  # noqa: BLE001 - a hostile __repr__
        s = f"<{_type_name(obj)} object: its __repr__ raised {_type_name(e)}>"
    return _encodable(cut(s, limit))


def _type_name(obj: Any, qualified: bool = False) -> str:
    try:
        t = type(obj)
        name = _plain(t.__qualname__ if isinstance(getattr(t, "__qualname__", None), str) else t.__name__)
        if qualified:
            mod = getattr(t, "__module__", None)
            if isinstance(mod, str) and mod:
                name = f"{_plain(mod)}.{name}"
        return _encodable(cut(name, 200))
    except Exception:  # noqa: BLE001
        return "<unnamed type>"


def exc_type(err: BaseException, qualified: bool = False) -> str:
    """The name of ``err``'s type (``module.Name`` with ``qualified``), bounded; never raises."""
    return _type_name(err, qualified)


def exc_text(err: BaseException, limit: int = MAX_CHARS, *, qualified: bool = False) -> str:
    """``"TypeName: message"`` for a target's exception, bounded and
    encodable; never raises (an ``err`` whose ``__str__`` raises is shown as
    such, not turned into the harness's own error)."""
    return f"{exc_type(err, qualified)}: {safe_str(err, limit)}"


# --------------------------------------------------------------------------
# Terminal
# --------------------------------------------------------------------------

def _escape_table() -> dict[int, str]:
    table: dict[int, str] = {}
    for c in list(range(0x00, 0x20)) + [0x7F] + list(range(0x80, 0xA0)):
        table[c] = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}.get(c, f"\\x{c:02x}")
    # invisible or reordering format characters: bidi embeddings/overrides/isolates,
    # line/paragraph separators, zero-width characters, the BOM
    for c in (0x061C, 0x200B, 0x200C, 0x200D, 0x200E, 0x200F, 0x2028, 0x2029, 0x202A, 0x202B, 0x202C, 0x202D,
              0x202E, 0x2060, 0x2066, 0x2067, 0x2068, 0x2069, 0xFEFF, 0xFFF9, 0xFFFA, 0xFFFB):
        table[c] = f"\\u{c:04x}"
    for c in range(0xD800, 0xE000):   # lone surrogates (safe_str already escaped them; belt and braces)
        table[c] = f"\\u{c:04x}"
    return table


_TERMINAL = _escape_table()


def terminal(obj: Any, limit: int = TERMINAL_CHARS, *, keep_newlines: bool = False) -> str:
    """Text for a console: :func:`safe_str`, with every control character
    (C0 including ``\\n``/``\\t``/``\\r``, DEL, C1) and every invisible
    reordering character shown escaped, so nothing a target wrote can move
    the cursor, recolour, retitle or rewrite what is shown.  Rich markup is
    not escaped here (``rich.markup.escape`` does that)."""
    s = safe_str(obj, limit).translate(_TERMINAL)
    if keep_newlines:
        s = s.replace("\\n", "\n")
    return s


# --------------------------------------------------------------------------
# XML
# --------------------------------------------------------------------------

def _xml_table() -> dict[int, str]:
    table = {c: f"\\x{c:02x}" for c in range(0x00, 0x20) if c not in (0x09, 0x0A)}
    table[0x0D] = "\\r"   # a raw CR is normalised away by XML parsers
    table.update({c: f"\\x{c:02x}" for c in [0x7F] + list(range(0x80, 0xA0))})
    table.update({c: f"\\u{c:04x}" for c in range(0xD800, 0xE000)})
    table.update({0xFFFE: "\\ufffe", 0xFFFF: "\\uffff"})
    return table


_XML = _xml_table()


def xml(obj: Any, limit: int = MAX_CHARS) -> str:
    """Text that XML 1.0 can carry: :func:`safe_str` with the characters
    XML forbids (most C0 controls, U+FFFE/U+FFFF, surrogates) and the
    discouraged ones (DEL, C1) shown escaped; ``&``, ``<``, ``>`` and quotes
    are left for the XML writer to escape."""
    return safe_str(obj, limit).translate(_XML)


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------

def clean(value: Any, limit: int = MAX_CHARS) -> Any:
    """Plain data with every string made :func:`safe_str` (dict keys too);
    other scalars as they are, anything else as its :func:`safe_repr`."""
    if isinstance(value, str):
        return safe_str(value, limit)
    if value is None or type(value) in (bool, int, float):
        return value
    if isinstance(value, dict):
        return {clean(k, limit) if isinstance(k, str) else k: clean(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v, limit) for v in value]
    return safe_repr(value, limit)


def clean_results(results: Any, limit: int = MAX_CHARS) -> Any:
    """Make every target-derived string of ``results`` (a list of
    :class:`~memspec.invariants.runner.PlanResult`, or a dict of such lists)
    plain, bounded and encodable, in place; returns ``results``.  Applied
    once where results enter reporting; idempotent."""
    groups = results.values() if isinstance(results, dict) else [results]
    for group in groups:
        for r in group:
            try:
                r.errors[:] = [safe_str(e, limit) for e in r.errors]
            except Exception:  # noqa: BLE001 - not a list: leave it to the writers' own guards
                pass
            for f in getattr(r, "failures", None) or []:
                for name in ("invariant", "cause", "reason", "repro"):
                    v = getattr(f, name, None)
                    if v is not None:
                        _set(f, name, safe_str(v, limit))
                cons = getattr(f, "consequences", None)
                if cons:
                    _set(f, "consequences", [safe_str(c, limit) for c in cons])
                for ts in getattr(f, "trace", None) or []:
                    for name in ("action", "outcome"):
                        v = getattr(ts, name, None)
                        if isinstance(v, str):
                            _set(ts, name, safe_str(v, limit))
    return results


def _set(obj: Any, name: str, value: Any) -> None:
    try:
        setattr(obj, name, value)
    except Exception:  # noqa: BLE001 - a frozen record: its writers guard it
        pass


__all__ = ["MAX_CHARS", "TERMINAL_CHARS", "cut", "safe_str", "safe_repr", "exc_type", "exc_text", "terminal",
           "xml", "clean", "clean_results"]
