"""The formal side's public face (``memspec.invariants.formal``, issue 33 item 4): every name resolves,
importing the package costs neither Z3 nor CrossHair, and a name rebound in its module is what the face
gives."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import memspec.invariants.formal as formal


def test_every_name_of_the_face_resolves() -> None:
    for name in formal.__all__:
        assert getattr(formal, name) is not None, name
    assert sorted(formal.__all__) == sorted(formal._FACE)


def test_no_name_of_the_face_is_a_module_of_the_package() -> None:
    """A submodule, once imported, is an attribute of the package and would hide a face name of its own."""
    mods = {m.name for m in pkgutil.iter_modules(formal.__path__)}
    assert not mods & set(formal.__all__), mods & set(formal.__all__)
    assert {m for m, _attr in formal._FACE.values()} <= mods


def test_importing_the_package_imports_neither_z3_nor_crosshair() -> None:
    code = "import sys, memspec.invariants.formal; print(sorted(m for m in ('z3', 'crosshair') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]", out


def test_a_name_rebound_in_its_module_is_what_the_face_gives(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    catalog = importlib.import_module("memspec.invariants.formal.proofs_catalog")
    assert formal.all_proofs is catalog.all_proofs
    monkeypatch.setattr(catalog, "all_proofs", lambda: [])
    from memspec.invariants.formal import all_proofs

    assert all_proofs() == []


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        formal.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("no AttributeError")
