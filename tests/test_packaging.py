"""Packaging: one import root, nothing generic in site-packages, wheel and editable installs both work."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = [
    "memspec",
    "memspec.spec",
    "memspec.spec.api",
    "memspec.spec.errors",
    "memspec.spec.core",
    "memspec.reference",
    "memspec.cuda_impl",
    "memspec.invariants",
    "memspec.invariants.mutants",
    "memspec.invariants.formal",
    "memspec.cli",
]
GENERIC = ["spec", "reference", "invariants", "cuda_impl", "tests", "bench"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (whl,) = out.glob("memspec-*.whl")
    return whl


def test_wheel_holds_only_the_memspec_import_root(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"memspec", next(t for t in tops if t.endswith(".dist-info"))}, tops
    # the user's folders are inside the root, with their type marker
    for sub in ("spec", "reference", "cuda_impl", "invariants"):
        assert any(n.startswith(f"memspec/{sub}/__init__.py") for n in names), sub
    assert "memspec/spec/py.typed" in names


def test_wheel_installs_into_a_fresh_venv_and_imports(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    # dependencies come from this interpreter's site-packages (a path entry, so
    # its .pth files -- including our own editable finder -- are not processed)
    deps = sysconfig.get_paths()["purelib"]
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    Path(site, "zz_deps.pth").write_text(deps + "\n")
    code = (
        "import importlib, importlib.util, sys, json\n"
        f"mods = {SUBPACKAGES!r}\n"
        "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
        f"generic = [g for g in {GENERIC!r} if importlib.util.find_spec(g) is not None]\n"
        "print(json.dumps({'files': files, 'generic': generic}))\n"
    )
    res = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    import json

    got = json.loads(res.stdout)
    assert got["generic"] == [], f"generic top-level modules installed: {got['generic']}"
    for mod, path in got["files"].items():
        assert path.startswith(str(env_dir)), f"{mod} imported from {path}, not the fresh venv"
    listing = os.listdir(site)
    assert not set(GENERIC) & set(listing), listing


def test_editable_install_maps_the_folders():
    import memspec.cuda_impl
    import memspec.invariants
    import memspec.reference
    import memspec.spec

    assert Path(memspec.spec.__file__).parent == ROOT / "spec"
    assert Path(memspec.reference.__file__).parent == ROOT / "reference"
    assert Path(memspec.cuda_impl.__file__).parent == ROOT / "cuda_impl"
    assert Path(memspec.invariants.__file__).parent == ROOT / "invariants"


def test_console_script_runs():
    exe = Path(sys.executable).parent / "memspec"
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True)
    assert "conform" in res.stdout and "prove" in res.stdout
