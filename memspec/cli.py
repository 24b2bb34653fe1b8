"""The ``memspec`` command: a thin dispatcher over ``memspec.commands.*``.

Each subcommand lives in its own module with ``main(argv: list[str]) -> int``
and is imported only when used, so ``memspec --help`` is instant and a
missing optional dependency only affects its own command.
"""

from __future__ import annotations

import importlib
import sys

#: name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "conform": ("memspec.commands.conform", "run the spec against allocator targets; table per invariant"),
    "targets": ("memspec.commands.targets", "list the conformance targets found"),
    "mutants": ("memspec.commands.mutants", "run every planted-bug mutant; print the kill table"),
    "fuzz": ("memspec.commands.fuzz", "time-budgeted fuzzing of a target with a failure database"),
    "spec-check": ("memspec.commands.spec_check", "run the spec's own stateful test (no implementation)"),
    "doc": ("memspec.commands.doc", "generate docs/SPEC.md from the spec (--check: fail if stale)"),
    "prove": ("memspec.commands.prove", "Z3: inductive proofs, unguarded variants, encoding agreement"),
    "contracts": ("memspec.commands.contracts", "CrossHair: check the spec kernels' contracts"),
    "demo": ("memspec.commands.demo", "stories from the seeds: `demo kv`, `demo fragmentation`"),
    "oom": ("memspec.commands.oom", "`oom explain`: walk the six-cause triage for an OOM message or snapshot"),
    "snapshot": ("memspec.commands.snapshot", "export/import/replay allocator snapshots; --svg picture"),
    "bench": ("memspec.commands.bench", "run the benchmarks under bench/ and print ratios"),
    "build-native": ("memspec.native", "opt-in: compile the walk's hot modules with mypyc (use: memspec --native ...)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: memspec [--native] COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`memspec COMMAND --help` for a command's options.",
              "--native: load the hot modules from `memspec build-native`'s build (pure Python, with a warning, "
              "if it is missing or stale)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--native":
        argv.pop(0)
        import os

        from memspec import native

        os.environ[native.ENV] = "1"  # worker processes (fuzz --jobs) inherit it
        native.enable()
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from memspec import __version__

        print(f"memspec {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"memspec: unknown command {name!r}\n", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
