"""Opt-in compiled hot paths (mypyc) for the random walk and the harness.

The pure-Python modules stay the source of truth and the default: nothing
here runs unless asked.  ``memspec build-native`` (or ``python -m
memspec.native build``) compiles the modules of :data:`MODULES` with mypyc
into a cache directory outside the source tree,
``~/.cache/memspec-native/<key>/`` (``$MEMSPEC_NATIVE_CACHE`` overrides the
root), where ``<key>`` hashes the Python version and the name and bytes of every
compiled source file.  ``MEMSPEC_NATIVE=1`` (or ``memspec --native
COMMAND``) then installs an import hook that loads those modules from the
build -- only if the build's recorded source hashes equal the ``.py`` files
as they are now.  A missing or stale build, or one made for another Python,
falls back to pure Python with a warning (:class:`NativeFallback`); so does a
process that has already imported one of the modules as Python.

What compiling changes: nothing in the walk's behaviour (the same code, the
same checks; ``tests/test_native.py`` compares the compiled walk's trace with
the pure one's for fixed seeds).  mypyc drops docstrings, so ``memspec doc``
must run pure Python; classes of compiled modules are native classes (no
``__dict__``, no ``__class__`` swap), so code that patches them at run time
needs the pure modules.

**Measured: no gain for the walk** (bench/README.md, "session F"); the
caching allocator, by contrast, runs 1.3-2.4x faster compiled (its bench
rows measure both).  CPU per walk step,
three interleaved pairs of fresh processes, 3,000 steps per level, mean of
the two levels: pure 196-222 us (median 207), compiled 181-251 us (median
200): within this machine's noise.  Compiling the reference too (before it
was left out for the reason below) gave the same.  The hot code is
dynamically typed (``Any`` states, callables in dataclass fields, dicts of
refs): mypyc then goes through the same generic C-API calls CPython's
interpreter makes and adds boxing and type checks at every boundary with
interpreted code (the engine, sortedcontainers, the reference).  The build
stays opt-in and off by default; the bench's walk row reports it whenever a
build of the current sources exists.

Use it for the walk and ``conform`` only: the proofs and CrossHair contracts
need the pure modules, and so does ``memspec doc`` (mypyc drops docstrings).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

#: the modules compiled: the spec's per-step code and the harness's
#: choosers and data-integrity checks (what a walk step runs, ``python -m
#: bench.profile walk``), restricted to what compiles to the same behaviour
#: (``tests/test_native.py`` compares the walks).  Left out, and why:
#:
#: * ``reference/*`` but the caching allocator: the implementation under test
#:   validates hostile input itself (``size="4096"`` -> ``InvalidRequest``);
#:   mypyc checks a parameter's annotation at the call, so a compiled
#:   ``size: int`` raises ``TypeError`` first -- a different answer, which the
#:   harness reports as a conformance failure (seen: S5 unexpected-exception
#:   on ``allocate``).  ``reference.caching`` (with its parts
#:   ``caching_blocks`` and ``caching_segments`` and with ``caching_stats``,
#:   compiled together: the native classes of one are used by the others) is
#:   written for the build: its validating entry points take ``Any``, its
#:   handle copies itself (``__copy__``: mypyc's classes refuse
#:   ``copyreg``'s argument-less construction) and its allocator class allows
#:   interpreted subclasses (the mutants); the caching tests, the hostile ones
#:   included, pass compiled (``tests/test_caching_native.py``);
#: * ``spec.kernels``: returns a symbolic quotient (``a / b``) under Z3 and
#:   CrossHair where it declares ``int`` (the proofs run these kernels);
#: * ``spec.holders``, ``spec.vmm``, ``spec.ep``, ``spec.manager``: their
#:   annotations disagree with the values they hold (a ``then`` declared
#:   ``-> None`` returns the bound id; lists of ``(ref, n)`` pairs declared
#:   ``list[int]``; KV requests keyed by id in a ``dict[str, ...]``): mypy
#:   says so, and compiled, the first raised ``TypeError`` in the trace test;
#: * ``spec.state``: ``spec.system`` keeps a per-state cache in the state's
#:   ``__dict__``, which a native class has not;
#: * ``spec.mechanism``, ``spec.system``: a machine's doc is its module's
#:   docstring, which mypyc drops;
#: * ``spec.api``, ``spec.errors``: implementations and plugins subclass them;
#:   exceptions cannot be native classes;
#: * ``invariants.engine``, ``invariants.planning`` (another owner): mypyc
#:   refuses ``engine`` (an unannotated empty list, line ~700);
#: * the guard (threads, ``sys.settrace``), the walk driver, the CLI.
MODULES: tuple[str, ...] = (
    "memspec.spec.core",
    "memspec.spec.invariants",
    "memspec.spec.eager",
    "memspec.spec.governor",
    "memspec.spec.shared",
    "memspec.spec.context",
    "memspec.invariants.choosers",
    "memspec.invariants.integrity",
    # the caching allocator (bench.caching's rows, ``memspec snapshot --replay``): compiled, its
    # presets ran 1.3-2.4x the pure-Python pairs per CPU second (bench caching rows, pure and
    # compiled side by side in one run); caching imports caching_segments, which imports
    # caching_blocks; all three import caching_stats
    "memspec.reference.caching_stats",
    "memspec.reference.caching_blocks",
    "memspec.reference.caching_segments",
    "memspec.reference.caching",
)

ENV = "MEMSPEC_NATIVE"
CACHE_ENV = "MEMSPEC_NATIVE_CACHE"
MANIFEST = "manifest.json"

#: mypy settings of the build: the sources are not (yet) clean under mypy;
#: mypyc compiles them with the types they declare and checks those at run
#: time (a wrong annotation raises ``TypeError`` in the compiled build only:
#: the trace comparison test is what catches it)
MYPY_INI = """[mypy]
ignore_errors = True
follow_imports = silent
ignore_missing_imports = True
"""


class NativeError(RuntimeError):
    """The native build could not be made (no compiler, no mypy, a compile error)."""


class NativeFallback(UserWarning):
    """``MEMSPEC_NATIVE`` was set but the pure-Python modules are used (the reason is the message)."""


# --------------------------------------------------------------------------
# Sources and the build key
# --------------------------------------------------------------------------

def source_file(module: str) -> Path:
    """The ``.py`` file of ``module`` as the pure-Python import would load it
    (found through its parent package's ``__path__``; the module itself is
    not imported)."""
    parent, _, leaf = module.rpartition(".")
    pkg = importlib.import_module(parent)
    spec = importlib.machinery.PathFinder.find_spec(leaf, list(pkg.__path__))
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise NativeError(f"{module}: no Python source found under {list(pkg.__path__)}")
    return Path(spec.origin)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_hashes(modules: Sequence[str] = MODULES) -> dict[str, str]:
    """module -> sha256 of its source, for ``modules`` *and* every other
    module of their packages: mypyc compiles against the types those
    declare (a compiled read of ``KvRequest.prefix_of`` checks the
    annotation in ``spec/state.py``), so a change there makes a build stale too."""
    out: dict[str, str] = {}
    for name, d in _package_dirs(modules).items():
        for f in sorted(d.glob("*.py")):
            out[name if f.stem == "__init__" else f"{name}.{f.stem}"] = _sha(f)
    for m in modules:
        out[m] = _sha(source_file(m))
    return dict(sorted(out.items()))


def _mypy_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("mypy")
    except Exception:  # noqa: BLE001 - not installed
        return None


def _python_tag() -> str:
    return f"{sys.implementation.cache_tag}-{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def build_key(hashes: dict[str, str]) -> str:
    h = hashlib.sha256()
    h.update(_python_tag().encode())
    for m in sorted(hashes):
        h.update(f"\0{m}\0{hashes[m]}".encode())
    return h.hexdigest()[:24]


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memspec-native"


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------

def _package_dirs(modules: Sequence[str]) -> dict[str, Path]:
    """The packages to lay out for mypy: every package of a compiled module
    and its parents (their other modules give mypy the types; they are
    copied, not compiled)."""
    pkgs: dict[str, Path] = {}
    for m in modules:
        parts = m.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in pkgs:
                pkgs[name] = Path(importlib.import_module(name).__path__[0])
    return pkgs


def build(modules: Sequence[str] = MODULES, root: Path | None = None, *, quiet: bool = True,
          force: bool = False) -> Path:
    """Compile ``modules`` with mypyc into ``root/<key>/``; the build's path.

    Reuses an existing build of the same key unless ``force``.  Raises
    :class:`NativeError` when mypy(c) or a C compiler is missing or the build fails."""
    if _mypy_version() is None:
        raise NativeError("mypy is not installed (pip install 'memspec[native]')")
    hashes = source_hashes(modules)
    key = build_key(hashes)
    root = root or cache_root()
    dest = root / key
    if not force and (dest / MANIFEST).is_file():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="memspec-native-") as tmp:
        work = Path(tmp)
        for name, src in _package_dirs(modules).items():
            d = work.joinpath(*name.split("."))
            d.mkdir(parents=True, exist_ok=True)
            for f in src.iterdir():
                if f.suffix == ".py" or f.name == "py.typed":
                    shutil.copy2(f, d / f.name)
        for m in modules:  # what is compiled is what was hashed
            if _sha(work.joinpath(*m.split(".")).with_suffix(".py")) != hashes[m]:
                raise NativeError(f"{m} changed while the build was copying it; build again")
        (work / "mypy.ini").write_text(MYPY_INI)
        files = [str(Path(*m.split(".")).with_suffix(".py")) for m in modules]
        cmd = [sys.executable, "-m", "mypyc", "--config-file", "mypy.ini", *files]
        env = dict(os.environ, MYPYC_OPT_LEVEL=os.environ.get("MYPYC_OPT_LEVEL", "3"))
        p = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            tail = (p.stdout + p.stderr).strip().splitlines()[-15:]
            raise NativeError("mypyc failed:\n" + "\n".join(tail))
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        exts: dict[str, str] = {}
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        for so in work.glob(f"*{suffix}"):  # mypyc's shared runtime group
            shutil.copy2(so, staging / so.name)
            exts[so.name[: -len(suffix)]] = so.name
        for m in modules:
            rel = Path(*m.split(".")).with_suffix(suffix)
            if not (work / rel).is_file():
                raise NativeError(f"mypyc made no extension for {m}")
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(work / rel, staging / rel)
            exts[m] = str(rel)
        manifest = {"key": key, "python": _python_tag(), "mypy": _mypy_version(), "sources": hashes,
                    "extensions": exts, "seconds": round(time.perf_counter() - t0, 1)}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(staging, dest)
    if not quiet:
        print(f"memspec native build: {len(modules)} modules in {manifest['seconds']} s -> {dest}")
    return dest


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------

class _Finder(importlib.abc.MetaPathFinder):
    """Serves the compiled extension of each module of the build (and
    mypyc's shared runtime module) and nothing else."""

    def __init__(self, build_dir: Path, exts: dict[str, str]):
        self.paths = {name: str(build_dir / rel) for name, rel in exts.items()}

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        p = self.paths.get(fullname)
        if p is None:
            return None
        return importlib.util.spec_from_file_location(fullname, p,
                                                      loader=importlib.machinery.ExtensionFileLoader(fullname, p))


_active: dict[str, Any] = {}


def active() -> bool:
    """True when this process loads (or loaded) the compiled modules."""
    return bool(_active)


def stale_reason(modules: Sequence[str] = MODULES, root: Path | None = None) -> tuple[Path | None, str | None]:
    """``(build dir, None)`` when a usable build of the current sources
    exists, else ``(None, why)``."""
    root = root or cache_root()
    try:
        hashes = source_hashes(modules)
    except (NativeError, ImportError) as e:
        return None, str(e)
    dest = root / build_key(hashes)
    mf = dest / MANIFEST
    if not mf.is_file():
        older = sorted(root.glob(f"*/{MANIFEST}"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
        for p in reversed(older):
            try:
                other = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if other.get("python") == _python_tag():
                recorded = other.get("sources") or {}
                changed = sorted(m for m in set(hashes) | set(recorded) if recorded.get(m) != hashes.get(m))
                return None, (f"the native build at {p.parent} is stale: "
                              f"{', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''} changed since; "
                              "run `memspec build-native`")
        return None, f"no native build of these sources under {root}; run `memspec build-native`"
    try:
        manifest = json.loads(mf.read_text())
    except (OSError, ValueError) as e:
        return None, f"unreadable native build manifest {mf}: {e}"
    if manifest.get("python") != _python_tag():
        return None, f"the native build at {dest} is for {manifest.get('python')}, not {_python_tag()}"
    recorded = manifest.get("sources") or {}
    if recorded != hashes:
        changed = sorted(m for m in set(hashes) | set(recorded) if recorded.get(m) != hashes.get(m))
        return None, f"the native build at {dest} does not match the sources ({', '.join(changed[:4])})"
    exts = manifest.get("extensions", {})
    missing = [m for m in modules if m not in exts or not (dest / exts[m]).is_file()]
    if missing:
        return None, f"the native build at {dest} lacks {', '.join(missing[:4])}"
    return dest, None


def enable(modules: Sequence[str] = MODULES, root: Path | None = None, *, warn: bool = True) -> bool:
    """Load ``modules`` from their native build from now on; False (and a
    :class:`NativeFallback` warning) when the pure-Python modules stay."""
    if _active:
        return True
    loaded = [m for m in modules if m in sys.modules]
    if loaded:
        why = f"already imported as Python before the native build could be enabled: {', '.join(loaded[:4])}"
        dest = None
    else:
        dest, why = stale_reason(modules, root)
    if dest is None:
        if warn:
            warnings.warn(f"{ENV}: running pure Python: {why}", NativeFallback, stacklevel=2)
        return False
    manifest = json.loads((dest / MANIFEST).read_text())
    exts = {n: r for n, r in manifest["extensions"].items() if n in modules or "." not in n}
    finder = _Finder(dest, exts)
    sys.meta_path.insert(0, finder)
    _active.update(build=str(dest), key=manifest["key"], modules=list(modules), finder=finder)
    return True


def info() -> dict[str, Any]:
    """What this process runs: ``{"native": bool, "build": dir or None, "compiled": [...] }``
    (a module counts as compiled only if it was actually loaded from the build)."""
    compiled = sorted(m for m in _active.get("modules", ())
                      if m in sys.modules and str(getattr(sys.modules[m], "__file__", "")).startswith(_active["build"]))
    return {"native": bool(compiled), "build": _active.get("build"), "compiled": compiled}


def enable_from_env() -> bool:
    """Called by ``memspec/__init__``: ``MEMSPEC_NATIVE=1`` enables the build."""
    if os.environ.get(ENV, "").strip().lower() in ("", "0", "false", "no", "off"):
        return False
    return enable()


# --------------------------------------------------------------------------
# `memspec build-native` / `python -m memspec.native`
# --------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="memspec build-native",
                                description="compile the walk's hot modules with mypyc into a cache directory "
                                            f"(used with {ENV}=1 or `memspec --native COMMAND`)")
    p.add_argument("action", nargs="?", default="build", choices=["build", "status", "path"])
    p.add_argument("--force", action="store_true", help="rebuild even if a build of these sources exists")
    p.add_argument("--cache", type=Path, help=f"cache root (default {cache_root()}; ${CACHE_ENV})")
    args = p.parse_args(argv)
    if args.action == "build":
        try:
            build(root=args.cache, quiet=False, force=args.force)
        except NativeError as e:
            print(f"memspec build-native: {e}", file=sys.stderr)
            return 1
        return 0
    dest, why = stale_reason(root=args.cache)
    if args.action == "path":
        if dest is None:
            print(why, file=sys.stderr)
            return 1
        print(dest)
        return 0
    print(f"native build: {dest}" if dest else f"no usable native build: {why}")
    return 0 if dest else 1


if __name__ == "__main__":
    sys.exit(main())
