"""Simulated ranks (fp4quant.comm.local): threads of one process run the collectives with the
bits real gloo ranks get (every compressed algorithm, stochastic rounding and chunking included;
an uncompressed sum of more than two ranks to the last bit of gloo's order), and a failing rank
breaks the others' waits instead of hanging them."""

from __future__ import annotations

import threading

import pytest
import torch

from distributed import run_ranks
from comm._local_jobs import sequence
from fp4quant.comm.local import LocalGroup


def run_threads(world: int, fn):
    group, results, errors = LocalGroup(world, timeout_s=60), [None] * world, []

    def body(handle):
        try:
            results[handle.rank] = fn(handle)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            group.abort()

    threads = [threading.Thread(target=body, args=(h,)) for h in group.ranks()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, errors


@pytest.mark.parametrize("world", [2, 4])
def test_threads_get_the_bits_of_real_ranks(world):
    real = run_ranks("comm._local_jobs:real", world, {}, timeout=180)
    local, errors = run_threads(world, lambda h: sequence(h.rank, world, group=h))
    assert not errors, errors
    for r in range(world):
        for name, tensor in real[r].items():
            if name == "exact" and world > 2:  # gloo's ring adds in its own order: the last bits may differ
                assert torch.allclose(tensor, local[r][name], rtol=1e-6, atol=1e-6), (r, name)
                continue
            assert torch.equal(tensor.view(torch.int32), local[r][name].view(torch.int32)), (r, name)


def test_a_failing_rank_breaks_the_others_wait():
    def fn(handle):
        if handle.rank == 1:
            raise RuntimeError("rank 1 fails")
        x = torch.ones(100)
        from fp4quant import comm
        comm.all_reduce(x, "fp4quant", group=handle)

    _, errors = run_threads(2, fn)
    assert any("rank 1 fails" in str(e) for e in errors)
    assert len(errors) == 2  # the other rank raised too (a broken barrier), it did not hang
