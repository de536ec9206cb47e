"""Sharding, padding and chunking of a collective (the random streams: fp4quant.comm.streams).

Two-shot all-reduce of N values over W ranks: the flattened tensor is zero-padded to
W * S values and viewed as (W, S); row r is the shard that rank r reduces.  S is a
multiple of ``config.block`` (the codec's padding block: the FWHT / coarse-scale group),
so every shard boundary is a block boundary: each rank quantizes exactly the blocks,
micro-groups and FWHT groups of the flat tensor that the one-shot algorithm (one
message of the whole tensor) quantizes, and a NaN stays in its own micro-group (or
FWHT group).  Padding costs at most W * block - 1 values per chunk.

Chunking: a long tensor is cut into chunks of ``chunk_values`` values (rounded down to a
multiple of the algorithm's unit: W * block for two-shot, block for one-shot and per
row for the others; at least one unit); each chunk is an independent collective, so
chunk k + 1 can be quantized while chunk k is on the wire.  Chunk boundaries are block
boundaries and the random draws follow the values' positions (fp4quant.comm.streams), so
chunking changes no bit of a block-local config's result.
"""

from __future__ import annotations

from dataclasses import dataclass


def shard_values(numel: int, world: int, block: int) -> int:
    """S: values per rank in a two-shot of ``numel`` values, a multiple of ``block``."""
    if numel <= 0:
        return 0
    unit = world * block
    return -(-numel // unit) * block


@dataclass(frozen=True)
class Chunk:
    """A pipeline slice of a collective (not the kernels' 8-value groups)."""

    start: int  # first value of the chunk in the flattened tensor (or row)
    numel: int  # values of the chunk


def chunks(numel: int, unit: int, chunk_values: int | None) -> list[Chunk]:
    """Cut ``numel`` values into chunks of ``chunk_values`` rounded down to a multiple of
    ``unit`` (at least one unit); one chunk when ``chunk_values`` is None."""
    if numel <= 0:
        return []
    if chunk_values is None or chunk_values >= numel:
        return [Chunk(0, numel)]
    size = max(unit, chunk_values // unit * unit)
    return [Chunk(s, min(size, numel - s)) for s in range(0, numel, size)]


def owner_runs(start: int, numel: int, shard: int) -> list[tuple[int, int]]:
    """[start, start + numel) cut where the rank that owns a value in a one-chunk two-shot
    changes (at multiples of ``shard``, the one-chunk shard size): (first, count) pairs.  A
    chunked two-shot re-quantizes each run with the one-chunk counters of its positions
    (streams.CallStreams.offset_requant); both ends and ``shard`` are block boundaries, so
    the runs are whole blocks."""
    runs = []
    end = start + numel
    while start < end:
        stop = min(end, (start // shard + 1) * shard)
        runs.append((start, stop - start))
        start = stop
    return runs


# The default chunking of all_reduce (chunk_bytes="auto"), per device type, from the
# collective benchmark (data/collectives.csv: "chunked" and "chunk_sweep" studies; the
# .meta.json summary has chunking_gain and overlap_gain).  On 2 gloo ranks over loopback
# (2 cores shared with other work, so +-30 % run to run), in two runs: 4-16 MiB chunks
# made the fast presets 1.2-1.5x faster at 64 MiB and 1.5-3.4x at 256 MiB; at 16 MiB,
# 4 MiB chunks lost ~10 % in the first run; 1 MiB chunks never paid.  Overlap (async
# collectives) against the "+sync" control, chunks one after the other: 7 of 9 points
# faster (median 1.09x) in the first run, 9 of 9 (median 1.35x) in the second.  Part of
# the gain on CPU is working on buffers below glibc's 32 MiB mmap threshold, reused
# rather than page-faulted in afresh on every call.  So: one chunk below 32 MiB, then
# 16 chunks of at least 4 MiB.  Not measured on CUDA: one chunk there.
MIN_CHUNKED_BYTES = {"cpu": 32 << 20}
MIN_CHUNK_BYTES = 4 << 20
CHUNKS_PER_MESSAGE = 16


def default_chunk_bytes(nbytes: int, device_type: str) -> int | None:
    """chunk_bytes="auto": on CPU, one chunk below 32 MiB, else max(4 MiB, nbytes / 16);
    None (one chunk) on other devices."""
    least = MIN_CHUNKED_BYTES.get(device_type)
    if least is None or nbytes < least:
        return None
    return max(MIN_CHUNK_BYTES, nbytes // CHUNKS_PER_MESSAGE)


def chunk_values(chunk_bytes: int | str | None, itemsize: int, numel: int = 0, device=None) -> int | None:
    """Values per chunk for a chunk size in bytes of the input (None: no chunking;
    "auto": default_chunk_bytes for ``numel`` values on ``device``)."""
    if chunk_bytes == "auto":
        chunk_bytes = default_chunk_bytes(numel * itemsize, getattr(device, "type", "cpu"))
    return None if chunk_bytes is None else max(1, chunk_bytes // itemsize)
