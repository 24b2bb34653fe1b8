"""The zoo: real third-party allocators under the suite, through the C ABI.

Each animal is a shim in ``adapters/c/zoo/`` (C, written with
``memspec_kit.h``) that loads a Debian-packaged allocator with ``dlopen`` --
no -dev package is needed -- and presents it as an ABI-2 plugin.  The shim
reports what the library says (``malloc_usable_size``, ``mi_usable_size``,
``sallocx``, ``tc_malloc_size``, plus an in-band header as ``block``),
never a figure fitted to the spec.

Run one by its short name::

    memspec conform c:zoo:jemalloc      # or the entry point: memspec conform zoo-jemalloc

The shim is compiled on first use (``cc``/``gcc``, or ``$CC``) into a cache
directory -- ``$MEMSPEC_ZOO_CACHE``, else ``$XDG_CACHE_HOME/memspec/zoo``,
else ``~/.cache/memspec/zoo`` -- under a name that carries the hash of its
sources, so an edited shim is rebuilt.  Before loading it, the library itself
is loaded here: when that fails the target is unavailable with a one-line
reason (the package to install, or the environment the process must start
with).

Debian's jemalloc needs one: ``libjemalloc.so.2`` is linked with
initial-exec TLS, and glibc lets a library loaded after start take only the
spare static TLS it reserved (``glibc.rtld.optional_static_tls``, 512 bytes
by default; jemalloc's block is 2632 bytes).  Start the process with
``GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096`` (what
:func:`required_env` returns; measured on Debian 12: 1024 fails, 2048 and up
load it).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from memspec.adapters._common import TargetUnavailable

ZOO_DIR = Path(__file__).resolve().parent / "c" / "zoo"
C_DIR = ZOO_DIR.parent
TLS_ENV = {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4096"}


def _jemalloc_version(lib: Any) -> str:
    p, n = ctypes.c_char_p(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_char_p))
    lib.mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p,
                            ctypes.c_size_t]
    if lib.mallctl(b"version", ctypes.byref(p), ctypes.byref(n), None, 0) != 0 or not p.value:
        return "?"
    return p.value.decode("ascii", "replace")[:80]


def _mimalloc_version(lib: Any) -> str:
    v = int(lib.mi_version())   # e.g. 209
    return f"{v // 100}.{v // 10 % 10}.{v % 10}"


def _tcmalloc_version(lib: Any) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    patch = ctypes.c_char_p()
    lib.tc_version.restype = ctypes.c_char_p
    lib.tc_version(ctypes.byref(major), ctypes.byref(minor), ctypes.byref(patch))
    return f"{major.value}.{minor.value}{(patch.value or b'').decode('ascii', 'replace')}"


def _glibc_version(lib: Any) -> str:
    lib.gnu_get_libc_version.restype = ctypes.c_char_p
    return lib.gnu_get_libc_version().decode("ascii", "replace")


@dataclass(frozen=True)
class Animal:
    """One allocator of the zoo."""

    name: str                       # short name: c:zoo:NAME, entry point zoo-NAME
    source: str                     # the shim, in adapters/c/zoo/
    sonames: tuple[str, ...]        # what the shim dlopens (the first that loads)
    package: str                    # the Debian package(s) that ship it
    version: Callable[[Any], str]   # the library's own version string
    env: dict = field(default_factory=dict)   # environment the process must start with


ZOO: dict[str, Animal] = {a.name: a for a in (
    Animal("glibc", "zoo_glibc.c", ("libc.so.6",), "libc6", _glibc_version),
    Animal("jemalloc", "zoo_jemalloc.c", ("libjemalloc.so.2",), "libjemalloc2", _jemalloc_version, dict(TLS_ENV)),
    Animal("mimalloc", "zoo_mimalloc.c", ("libmimalloc.so.2",), "libmimalloc2.0", _mimalloc_version),
    Animal("tcmalloc", "zoo_tcmalloc.c", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"),
           "libtcmalloc-minimal4 or libgoogle-perftools4", _tcmalloc_version),
)}

#: the Debian packages the zoo needs (``.ci/run`` installs them)
PACKAGES = ("libjemalloc2", "libmimalloc2.0", "libtcmalloc-minimal4", "libgoogle-perftools4")


def animal(name: str) -> Animal:
    try:
        return ZOO[name]
    except KeyError:
        raise LookupError(f"no zoo allocator {name!r} (the zoo: {', '.join(sorted(ZOO))})") from None


def required_env(name: str) -> dict[str, str]:
    """The environment a process must *start* with to load this allocator."""
    return dict(animal(name).env)


def cache_dir() -> Path:
    d = os.environ.get("MEMSPEC_ZOO_CACHE")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "memspec" / "zoo"


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


_build_lock = threading.Lock()


def build(name: str, out_dir: Path | None = None) -> Path:
    """The shim of ``name`` compiled (once per source hash) into ``out_dir``
    (default :func:`cache_dir`); TargetUnavailable without a compiler."""
    a = animal(name)
    cc = compiler()
    if cc is None:
        raise TargetUnavailable(f"zoo:{name} needs a C compiler to build its shim (cc/gcc, or $CC)")
    sources = [ZOO_DIR / a.source, ZOO_DIR / "zoo_common.h", C_DIR / "memspec_kit.h", C_DIR / "memspec_plugin.h"]
    h = hashlib.sha256()
    for s in sources:
        h.update(s.read_bytes())
    h.update(cc.encode())
    out_dir = Path(out_dir) if out_dir is not None else cache_dir()
    lib = out_dir / f"zoo_{name}-{h.hexdigest()[:12]}.so"
    with _build_lock:
        if lib.exists():
            return lib
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)   # built aside, then renamed: concurrent builds are safe
        os.close(fd)
        try:
            p = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{C_DIR}", f"-I{ZOO_DIR}", "-o",
                                tmp, str(ZOO_DIR / a.source), "-ldl"], capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                raise TargetUnavailable(f"zoo:{name}: building {a.source} failed: "
                                        f"{(p.stderr or p.stdout).strip().splitlines()[-1:]}")
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return lib


def preflight(name: str) -> tuple[str, str]:
    """Load the allocator's library into this process; its soname and
    version.  TargetUnavailable, in one line, when it does not load."""
    a = animal(name)
    errors = []
    for so in a.sonames:
        try:
            lib = ctypes.CDLL(so)
        except OSError as e:
            errors.append(str(e))
            continue
        try:
            return so, a.version(lib)
        except Exception as e:  # noqa: BLE001 - a version we cannot read is no reason to refuse the library
            return so, f"? ({type(e).__name__})"
    why = errors[-1] if errors else "no soname"
    if "static TLS" in why:
        env = " ".join(f"{k}={v}" for k, v in a.env.items()) or "GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096"
        missing = [k for k, v in a.env.items() if os.environ.get(k) != v]
        hint = f"start the process with {env}" if missing else f"{env} is set and not enough: raise the value"
        raise TargetUnavailable(f"zoo:{name}: {a.sonames[0]} needs static TLS that a library loaded after start "
                                f"cannot get: {hint}")
    raise TargetUnavailable(f"zoo:{name}: {why} (install the Debian package {a.package})")


_factories: dict[str, Callable[..., Any]] = {}
_versions: dict[str, str] = {}


def factory(name: str) -> Callable[..., Any]:
    """The target factory of zoo allocator ``name`` (``c:zoo:NAME``): the
    library checked, the shim built and loaded."""
    from memspec.adapters.c_plugin import factory as c_factory

    if name not in _factories:
        so, version = preflight(name)
        make = c_factory(str(build(name)))
        _versions[name] = f"{so} {version}"

        def zoo_make(capacity: int | None = None, _make: Callable[..., Any] = make, _n: str = name) -> Any:
            inst = _make(capacity)
            inst.extras["library"] = _versions[_n]
            return inst

        zoo_make.__name__ = f"zoo_{name}"
        zoo_make.__doc__ = f"zoo:{name}: {so} {version} through adapters/c/zoo/{animal(name).source}"
        zoo_make.memspec_env = required_env(name)  # type: ignore[attr-defined]
        _factories[name] = zoo_make
    return _factories[name]


def library_version(name: str) -> str:
    """``soname version`` of a loaded zoo allocator (after :func:`factory`)."""
    return _versions.get(name, "")


def _entry(name: str) -> Callable[..., Any]:
    def make(capacity: int | None = None) -> Any:
        return factory(name)(capacity)

    make.__name__ = f"zoo_{name}"
    make.__doc__ = f"zoo:{name} ({animal(name).package}) through the C ABI"
    make.memspec_env = required_env(name)  # type: ignore[attr-defined]
    return make


# entry points (memspec.targets): zoo-glibc, zoo-jemalloc, zoo-mimalloc, zoo-tcmalloc
glibc = _entry("glibc")
jemalloc = _entry("jemalloc")
mimalloc = _entry("mimalloc")
tcmalloc = _entry("tcmalloc")
