"""``memspec oom explain``: why did this CUDA out-of-memory happen?

Reads the message (arguments, ``--file FILE``, or stdin), optionally
``torch.cuda.memory_stats()`` (``--memory-stats FILE``), nvidia-smi's
``--query-compute-apps=pid,used_memory --format=csv`` (``--nvidia-smi FILE``)
or a ``torch.cuda.memory._snapshot()`` pickle (``--snapshot FILE``), and what
the message cannot carry (``--distributed``, ``--cudnn-benchmark``,
``--cuda-graphs``, ``--pid``).  First: does the request fit at all?  Then seed
003's six causes in order, each on evidence, or ``unknown`` with what is
missing.  ``--json`` prints ``{"parsed", "cause", "evidence", "next_steps"}``.

The parsing and the triage live in :mod:`memspec.triage.oom`.
"""

from __future__ import annotations

import argparse
import json
import sys

from memspec.triage import oom as lib

#: the most text read from one input (pasted logs of tens of MB are fine)
MAX_INPUT = 256 * lib.MiB


def _pid(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {s!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"a process id is positive, got {v}")
    return v


def _read(path: str) -> bytes:
    if path == "-":
        data = sys.stdin.buffer.read(MAX_INPUT + 1)
    else:
        with open(path, "rb") as fh:
            data = fh.read(MAX_INPUT + 1)
    if len(data) > MAX_INPUT:
        raise ValueError(f"{path}: more than {MAX_INPUT >> 20} MiB; cut the log around the error")
    return data


def _text(path: str, what: str) -> str:
    return lib.to_bytes(_read(path)).decode("utf-8")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="memspec oom", description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=("explain",))
    ap.add_argument("message", nargs="*", help="the OOM message text (or use --file / stdin)")
    ap.add_argument("--file", help="read the message from FILE ('-' = stdin)")
    ap.add_argument("--snapshot", help="a torch.cuda.memory._snapshot() pickle")
    ap.add_argument("--memory-stats", metavar="FILE", help="torch.cuda.memory_stats() as printed (dict/OrderedDict/JSON)")
    ap.add_argument("--nvidia-smi", metavar="FILE",
                    help="nvidia-smi --query-compute-apps=pid,used_memory --format=csv output")
    ap.add_argument("--pid", type=_pid, help="this process's PID (as nvidia-smi shows it)")
    ap.add_argument("--message", dest="which", type=int, metavar="N",
                    help="with several OOM messages in the input: triage the N-th (1-based; -1 = the last, the "
                         "default)")
    ap.add_argument("--distributed", action="store_true", help="a distributed (NCCL) run")
    ap.add_argument("--cuda-graphs", "--graphs", dest="cuda_graphs", action="store_true",
                    help="CUDA graphs were captured (torch.cuda.graph, torch.compile mode='reduce-overhead')")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark=True")
    ap.add_argument("--json", action="store_true", help="print the verdict as JSON")
    ap.add_argument("--svg", metavar="FILE", help="with --snapshot: draw its segments and blocks into this SVG file")
    return ap


def main(argv: list[str]) -> int:
    args = build_parser().parse_intermixed_args(argv)
    if args.svg and not args.snapshot:
        print("memspec oom explain: --svg draws a snapshot: give --snapshot PICKLE", file=sys.stderr)
        return 2
    hints = dict(distributed=args.distributed, cudnn_benchmark=args.cudnn_benchmark, cuda_graphs=args.cuda_graphs)
    err = "memspec oom explain"
    snap = None
    try:
        if args.snapshot:
            from memspec.reference.caching_snapshot import load

            snap = load(args.snapshot)
            f = lib.figures_from_snapshot(snap)
        else:
            if args.file:
                data: bytes | str = _read(args.file)
            elif args.message:
                data = " ".join(args.message)
            else:
                data = _read("-")
            f = lib.parse(data, pid=args.pid, which=args.which)
        if args.memory_stats:
            lib.apply_memory_stats(f, lib.parse_memory_stats(_text(args.memory_stats, "memory_stats")))
        if args.nvidia_smi:
            lib.apply_nvidia_smi(f, lib.parse_nvidia_smi(_text(args.nvidia_smi, "nvidia-smi")), args.pid)
    except (lib.NotAnOOM, lib.BinaryInput) as e:
        print(f"{err}: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"{err}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the snapshot loader's named errors (InvalidRequest) and malformed fields
        from memspec.spec.errors import InvalidRequest

        if isinstance(e, (InvalidRequest, KeyError, TypeError)):
            print(f"{err}: cannot read {args.snapshot}: {type(e).__name__}: {e}", file=sys.stderr)
            return 2
        raise
    v = lib.triage(f, **hints)
    replay_lines: list[str] = []
    if snap is not None and any(snap.get("device_traces") or []):
        from memspec.reference.caching_snapshot import would_expandable_avoid_oom

        from memspec.spec.errors import MemspecError

        try:
            avoided, fixed, exp = would_expandable_avoid_oom(snap)
        except MemspecError as e:  # a snapshot that loads but cannot be replayed (e.g. no segments)
            replay_lines = [f"replay not possible, so expandable segments were not tried: {type(e).__name__}: {e}"]
        else:
            replay_lines = [f"replay ({fixed.preset}, capacity {lib.fmt(fixed.capacity)}): fixed segments -> "
                            f"{len(fixed.ooms)} OOM(s); expandable segments -> {len(exp.ooms)} OOM(s)",
                            "would expandable segments have avoided this OOM? " + ("YES" if avoided else "no")]
        v.evidence.extend(replay_lines)
    if args.json:
        print(json.dumps(v.as_json(f), indent=2))
    else:
        print(lib.explain_text(f, v))
    if args.svg and snap is not None:  # the same picture as ``memspec snapshot --svg``
        from memspec.invariants.pictures import snapshot_svg

        with open(args.svg, "w", encoding="utf-8") as fh:
            fh.write(snapshot_svg(snap))
    return 0
