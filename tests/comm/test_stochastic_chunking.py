"""Chunking never changes the bits of a block-local compressed collective, stochastic rounding
included: every stochastic-rounding draw is keyed by the value's position in the whole call
(fp4quant.comm.streams), and the single-chunk draws are those of the committed runs.

Two gloo ranks run each collective with one chunk and with chunks that cut the tensor
where the one-chunk call does not (so the two-shot's reduced shards straddle the one-chunk
shards); the test process compares the results bit for bit, and rebuilds the one-chunk
all-reduce from the codec ops with the counter layout written out by hand.
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from fp4quant import ops
from fp4quant.comm.plan import chunks, owner_runs, shard_values
from fp4quant.comm.streams import RANK_SHIFT, REQUANT_BIT, CallStreams, derive
from fp4quant.format.config import QuantConfig

pytestmark = pytest.mark.timeout(300)

WORLD = 2
SEED = 2024
# block-local configs (all but nvfp4's per-tensor scale), stochastic rounding
CONFIGS = {
    "fp4quant": QuantConfig.preset("fp4quant", group=256, rounding="stochastic"),
    "no_fwht": QuantConfig.preset("no_fwht", group=256, rounding="stochastic"),
    "mxfp4": QuantConfig.preset("mxfp4", rounding="stochastic"),
    "int4": QuantConfig.preset("int4", rounding="stochastic"),
}
# values per call: not a multiple of any chunk, so the last chunk is ragged and padded
N = 7 * WORLD * 256 + 77


def inputs(rank: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(n, generator=g) * torch.logspace(-2, 2, n)  # a range of magnitudes
    return x.to(dtype)


def reduce_scatter_input(rank: int, world: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([inputs(rank + 10 * (j + 1), N, dtype) for j in range(world)])


def chunking_job(rank: int, world: int, names: list[str]) -> dict:
    """On each rank: every collective once per chunking (a fresh RandomStreams(SEED) each time,
    so that every call draws the same call seed)."""
    import fp4quant.comm as comm

    out = {}
    for name in names:
        config = CONFIGS[name]
        block = config.block
        # chunk sizes in values: the two-shot's unit (world * block) times 1, 2 and 3 (with 3,
        # a chunk's shard straddles two one-chunk shards), and one that rounds up to one unit
        chunkings = [None, world * block, 2 * world * block, 3 * world * block, 1]
        for dtype in (torch.float32, torch.bfloat16):
            x = inputs(rank, N, dtype)
            for algo in ("two_shot", "one_shot"):
                for c in chunkings:
                    y = x.clone()
                    comm.all_reduce(y, config, algorithm=algo, chunk_bytes=None if c is None else c * y.element_size(),
                                    streams=comm.RandomStreams(SEED))
                    out[(name, str(dtype), algo, c)] = y
            big = reduce_scatter_input(rank, world, dtype)
            for c in (None, block, 3 * block):
                cb = None if c is None else c * x.element_size()
                g = torch.empty(world * N, dtype=dtype)
                comm.all_gather(g, x, config, chunk_bytes=cb, streams=comm.RandomStreams(SEED))
                out[(name, str(dtype), "all_gather", c)] = g
                o = torch.empty(N, dtype=dtype)
                comm.reduce_scatter(o, big, config, chunk_bytes=cb, streams=comm.RandomStreams(SEED))
                out[(name, str(dtype), "reduce_scatter", c)] = o
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks("comm.test_stochastic_chunking:chunking_job", WORLD, dict(names=list(CONFIGS)), timeout=280)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def one_chunk_two_shot(config: QuantConfig, dtype: torch.dtype) -> torch.Tensor:
    """The one-chunk two-shot all-reduce from the ops, with the counters of the committed runs:
    rank r quantizes its W rows from counter r << 48 (row j's value i: + j * S + i), and
    re-quantizes its reduced shard from (r << 48) + 2**47."""
    seed = derive(SEED, 0)  # the first call of RandomStreams(SEED)
    S = shard_values(N, WORLD, config.block)
    msgs = []
    for r in range(WORLD):
        padded = torch.zeros(WORLD * S, dtype=dtype)
        padded[:N] = inputs(r, N, dtype)
        msgs.append(ops.quantize_rows(padded.view(WORLD, S), config, seed, r << RANK_SHIFT))
    shards = [ops.dequantize_reduce(torch.stack([m[j] for m in msgs]), S, config, dtype, True, seed,
                                    (j << RANK_SHIFT) + REQUANT_BIT) for j in range(WORLD)]
    return ops.dequantize_rows(torch.stack(shards), S, config, dtype, saturate=WORLD == 1).view(-1)[:N]


def one_chunk_reduce_scatter(config: QuantConfig, dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Rank ``rank``'s one-chunk reduce-scatter from the ops: rank r quantizes its W rows from
    counter r << 48 (row j's value i: + j * padded(N) + i)."""
    seed = derive(SEED, 0)
    msgs = [ops.quantize_rows(reduce_scatter_input(r, WORLD, dtype).view(WORLD, N), config, seed, r << RANK_SHIFT)
            for r in range(WORLD)]
    return ops.dequantize_reduce(torch.stack([m[rank] for m in msgs]), N, config, dtype, False)


@pytest.mark.parametrize("name", CONFIGS)
def test_chunking_does_not_change_the_bits(results, name):
    for rank, out in enumerate(results):
        for (cfg, dtype, algo, c), y in out.items():
            if cfg != name:
                continue
            ref = out[(cfg, dtype, algo, None)]
            assert torch.equal(bits(y), bits(ref)), (rank, cfg, dtype, algo, c)
            if algo != "reduce_scatter":  # (each rank keeps its own shard)
                assert torch.equal(bits(y), bits(results[0][(cfg, dtype, algo, c)])), ("ranks differ", rank, cfg, algo, c)


@pytest.mark.parametrize("name", CONFIGS)
def test_one_chunk_calls_keep_the_committed_draws(results, name):
    for dtype in (torch.float32, torch.bfloat16):
        want = one_chunk_two_shot(CONFIGS[name], dtype)
        got = results[0][(name, str(dtype), "two_shot", None)]
        assert torch.equal(bits(got), bits(want)), (name, dtype)
        for rank in range(WORLD):
            got = results[rank][(name, str(dtype), "reduce_scatter", None)]
            assert torch.equal(bits(got), bits(one_chunk_reduce_scatter(CONFIGS[name], dtype, rank))), (name, dtype, rank)


def test_owner_runs_and_requant_counters():
    # a one-chunk shard of 2048: a chunk's shard [1536, 2304) straddles ranks 0 and 1
    assert owner_runs(1536, 768, 2048) == [(1536, 512), (2048, 256)]
    assert owner_runs(0, 2048, 2048) == [(0, 2048)]
    assert owner_runs(4096, 0, 2048) == []
    assert owner_runs(100, 5000, 2048) == [(100, 1948), (2048, 2048), (4096, 1004)]
    # one chunk: rank r re-quantizes its shard from (r << 48) + 2**47, as the committed runs did
    for r in range(4):
        assert CallStreams.offset_requant(r * 2048, 2048) == CallStreams(7, r).offset(0, requant=True)
    assert CallStreams.offset_requant(2048 + 300, 2048) == (1 << RANK_SHIFT) + REQUANT_BIT + 300


def test_the_chunkings_tested_cut_the_one_chunk_shards():
    """The job's 3-unit chunks give a reduced shard that straddles two one-chunk shards (the
    path that re-quantizes run by run), for every config tested."""
    for config in CONFIGS.values():
        block = config.block
        shard = shard_values(N, WORLD, block)
        straddles = [len(owner_runs(ch.start + r * S, S, shard)) > 1
                     for ch in chunks(N, WORLD * block, 3 * WORLD * block)
                     for S in [shard_values(ch.numel, WORLD, block)] for r in range(WORLD)]
        assert any(straddles), config
