"""``memspec demo fragmentation`` prints the seed's figures (seed 003, "Actual output")."""

from __future__ import annotations

from memspec.commands import demo_fragmentation

# The seed's "Actual output", with its display wrap of the OOM line joined.
SEED_LINES = [
    "fill:  reserved=40M allocated=40M requested=32M",
    "freed: reserved=40M allocated=24M requested=20M free=16M largest=4M",
    "segment 0: seg0[0..4)M 4M FREE seg0[4..10)M 6M LIVE seg0[10..14)M 4M FREE seg0[14..20)M 6M LIVE",
    "OOM: CUDA out of memory. Tried to allocate 20 MiB (device 40 MiB; 40 MiB reserved; "
    "16 MiB is reserved but unallocated; largest free block 4 MiB)",
    "4 MiB alloc from a hole: OK -> seg0[0..4)M 4M LIVE",
    "empty_cache() released: 0 MiB",
]
SEED_EXPANDABLE = [
    "expandable fill:            mapped=40M",
    "expandable freed 4 MiB side: mapped=24M (pages returned NOW)",
    "expandable 8 MiB alloc:     OK at VA +40M, mapped=32M",
]


def test_seed_preset_prints_the_seeds_lines(capsys):
    assert demo_fragmentation.main(["--preset", "seed"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == SEED_LINES + [""] + SEED_EXPANDABLE


def test_both_presets_then_the_pytorch_paragraph(capsys):
    assert demo_fragmentation.main([]) == 0
    out = capsys.readouterr().out
    seed_part, pytorch_part = out.split("== preset: pytorch ==")
    assert all(line in seed_part.splitlines() for line in SEED_LINES + SEED_EXPANDABLE)
    lines = pytorch_part.splitlines()
    assert "fill:  reserved=40M allocated=33.001M requested=32M" in lines
    oom = [l for l in lines if l.startswith("OOM: ")]
    assert oom and "Tried to allocate 20.00 MiB" in oom[0] and "is reserved by PyTorch but unallocated" in oom[0]
    assert "empty_cache() released: 0 MiB" in lines
    assert any(l.startswith("expandable 8 MiB alloc:     OOM: ") for l in lines)
    assert demo_fragmentation.PYTORCH_PARAGRAPH in out


def test_bad_option_is_refused(capsys):
    import pytest

    with pytest.raises(SystemExit):
        demo_fragmentation.main(["--preset", "tensorflow"])
