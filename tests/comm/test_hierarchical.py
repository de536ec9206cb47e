"""algorithm="hierarchical" on two nodes of two gloo ranks: the exact wire gives the exact sum,
the compressed wire errs no more than the flat two-shot on the same data, every rank ends with
the same bits, whatever the chunking or the intra-node wire; a bad layout is one line."""

from __future__ import annotations

import pytest

from distributed import run_ranks
from fp4quant.comm import auto
from fp4quant.comm.layout import NodeLayout


def test_layouts():
    layout = NodeLayout.consecutive(4, 2)
    assert layout.nodes == ((0, 1), (2, 3)) and layout.ranks_per_node == 2
    assert layout.node_peers(3) == [2, 3] and layout.rail_peers(3) == [1, 3] and layout.local_index(2) == 0
    with pytest.raises(ValueError, match="does not divide"):
        NodeLayout.consecutive(4, 3)
    assert auto.choose(1 << 30, 4, "nccl", layout) == "hierarchical"
    assert auto.choose(1 << 30, 4, "nccl", NodeLayout.consecutive(4, 1)) == "two_shot"
    assert auto.choose(1 << 30, 4, "nccl", None) == "two_shot"


@pytest.fixture(scope="module")
def ranks():
    return run_ranks("comm._hierarchical_jobs:sums", 4, {}, timeout=300)


def test_the_exact_wire_gives_the_exact_sum(ranks):
    for r in ranks:
        # relative error in norm (float32 sums of four float32 tensors against the float64 sum)
        assert r["exact"]["same_on_every_rank"] and r["exact"]["nmse"] ** 0.5 < 1e-6, r["exact"]
        assert r["bf16_exact"]["same_on_every_rank"]


def test_compressed_errs_no_more_than_the_flat_two_shot(ranks):
    for r in ranks:
        for name in ("hier", "flat", "hier_forwarded", "hier_chunked", "sr", "sr_chunked", "bf16"):
            assert r[name]["same_on_every_rank"], name
        assert r["hier"]["nmse"] <= r["flat"]["nmse"] * 1.05, (r["hier"], r["flat"])
        assert r["bf16_dtype"] == "torch.bfloat16"


def test_neither_chunking_nor_the_intra_wire_changes_a_bit(ranks):
    for r in ranks:
        assert r["forwarding_same_bits"] and r["chunking_same_bits"] and r["stochastic_chunking_same_bits"]


def test_what_crosses_the_wire(ranks):
    stats = ranks[0]["stats"]  # the hierarchy sends its intra-node half uncompressed: more bytes in all
    assert stats["flat"] < stats["hier"] < stats["exact"], stats


def test_the_layout_from_torchrun():
    results = run_ranks("comm._hierarchical_jobs:sums", 4, {"n": 5000, "ranks_per_node": None}, timeout=300,
                        env={"LOCAL_WORLD_SIZE": "2"})
    assert all(r["hier"]["same_on_every_rank"] and r["exact"]["nmse"] ** 0.5 < 1e-6 for r in results)


def test_bad_layouts_and_options_are_one_line_on_every_rank():
    for r in run_ranks("comm._hierarchical_jobs:refusals", 4, {}, timeout=120):
        assert "does not divide the group's 4 ranks" in r["uneven"], r
        assert "max" in r["max"] and "intra_wire" in r["intra_wire"], r
        assert all("\n" not in r[k] for k in ("uneven", "max", "intra_wire")) and r["in_step"]
