"""The counter-based random stream: matches its spec, uniform, and offsets compose."""

from __future__ import annotations

import torch

from fp4quant.format.random import MASK32, fwht_signs, mix32, mix32_int, stream_key, uniform


def spec_uniform(seed: int, counter: int) -> float:
    """docs/format.md, step 6, written with Python integers."""
    key = mix32_int((seed & MASK32) ^ mix32_int((seed >> 32) ^ 0x9E3779B9))
    h = mix32_int((counter & MASK32) ^ mix32_int(((counter >> 32) & MASK32) ^ key))
    return (h >> 8) * 2.0**-24


def test_tensor_hash_matches_integer_hash():
    xs = [0, 1, 2, 12345, MASK32, 0xDEADBEEF, 1 << 31]
    assert mix32(torch.tensor(xs)).tolist() == [mix32_int(x) for x in xs]


def test_uniform_matches_spec_across_the_32_bit_boundary():
    seed, offset = (7 << 40) | 99, (1 << 32) - 3
    got = uniform(6, seed, offset).tolist()
    assert got == [spec_uniform(seed, offset + i) for i in range(6)]


def test_offsets_compose():
    assert torch.equal(uniform(100, 5, 0)[40:], uniform(60, 5, 40))


def test_uniform_statistics():
    u = uniform(1 << 18, 11, 0).double()
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.003
    assert abs(float(u.var()) - 1 / 12) < 0.002
    hist = torch.histc(u, bins=16, min=0, max=1)
    assert float((hist / hist.mean() - 1).abs().max()) < 0.03


def test_streams_differ_by_seed_and_salt():
    assert not torch.equal(uniform(64, 1, 0), uniform(64, 2, 0))
    assert stream_key(1) != stream_key(1, salt=0x85EBCA6B)


def test_fwht_signs_are_balanced_and_fixed():
    s = fwht_signs(4096, 0)
    assert abs(float(s.mean())) < 0.05
    assert torch.equal(s, fwht_signs(4096, 0))
    s[0] = 5  # callers get a copy
    assert float(fwht_signs(4096, 0)[0]) in (-1.0, 1.0)
