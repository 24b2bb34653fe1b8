"""Caching observations: the implementation's ``memory_stats()`` and
``snapshot()`` layout read back and compared with the spec's."""

from __future__ import annotations

from typing import Any

from memspec.spec.caching.invariants import layout_violations, spec_segments
from memspec.spec.caching.state import LIVE, PENDING, CachingState, Policy
from memspec.spec.core import Observation


def _impl_segments(sut: Any) -> list[dict]:
    segs = sut.allocator.snapshot()["segments"]
    return sorted(({"address": s["address"], "total_size": s["total_size"], "segment_type": s["segment_type"],
                    "is_expandable": s["is_expandable"], "stream": s["stream"],
                    "blocks": [{"address": b["address"], "size": b["size"], "state": b["state"],
                                "requested_size": b["requested_size"] if b["state"] != "inactive" else 0}
                               for b in s["blocks"]]} for s in segs), key=lambda d: d["address"])


def _impl_layout_check(inv: str):
    def observed(sut: Any, _r: Any) -> str | None:
        return layout_violations(_impl_segments(sut))[inv]
    return observed


def _pending(segments: list[dict]) -> list[int]:
    return sorted(b["address"] for s in segments for b in s["blocks"] if b["state"] == "active_pending_free")


def _stats_expected(st: CachingState, _r: Any) -> dict[str, int]:
    out = {}
    for small, name in ((None, "all"), (True, "small_pool"), (False, "large_pool")):
        out[f"reserved_bytes.{name}.current"] = st.reserved(small)
        out[f"allocated_bytes.{name}.current"] = st.figure((LIVE,), small)
        out[f"active_bytes.{name}.current"] = st.figure((LIVE, PENDING), small)
        out[f"requested_bytes.{name}.current"] = st.figure((LIVE, PENDING), small, requested=True)
    out["num_ooms"] = st.num_ooms
    return out


def _stats_observed(sut: Any, _r: Any) -> dict[str, int]:
    flat = sut.allocator.memory_stats()
    return {k: flat[k] for k in _stats_expected(CachingState(Policy()), None)}


def _global(_s: Any, _t: Any):
    return (None,)


OBSERVATIONS = [
    Observation("layout tiles (C2)", "C2", _global, lambda st, r: None, _impl_layout_check("C2")),
    Observation("free neighbours coalesced (C3)", "C3", _global, lambda st, r: None, _impl_layout_check("C3")),
    Observation("pools never mix (C4)", "C4", _global, lambda st, r: None, _impl_layout_check("C4")),
    Observation("pending frees (C7)", "C7", _global, lambda st, r: _pending(spec_segments(st)),
                lambda sut, r: _pending(_impl_segments(sut))),
    Observation("memory_stats (C1)", "C1", _global, _stats_expected, _stats_observed),
    Observation("segments and blocks (C2)", "C2", _global, lambda st, r: spec_segments(st),
                lambda sut, r: _impl_segments(sut)),
]

