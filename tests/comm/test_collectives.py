"""fp4quant.comm on real process groups: gloo, world sizes 1 to 4 (NCCL when GPUs exist).

One multi-process job per world size runs every check (_comm_jobs.py) and records what
it measured; the tests below judge the records.  Process start costs ~2 s here, so the
jobs are shared (module-scoped fixture) rather than launched per test.

Error bounds, from the codec's error measured here (per preset: eps, the NMSE
||Q(x) - x||^2 / ||x||^2 of one quantization of a Gaussian tensor, averaged over the
tensors and seeds of fp4quant.bench.error: the number data/error.csv records, computed
afresh so that regenerating the data cannot change whether these tests pass):

* one-shot: y = sum_r Q(x_r) = sum_r x_r + sum_r e_r with E||e_r||^2 = eps ||x_r||^2 and the
  errors of different ranks uncorrelated, so E||y - s||^2 = eps sum_r ||x_r||^2.  The
  inputs are independent zero-mean Gaussians, so ||s||^2 = ||sum_r x_r||^2 ~ sum_r ||x_r||^2
  and NMSE_one ~ eps (a Gaussian again, so the same eps applies).  Bound: within 15 %.
* two-shot: the reduced shard s + e is quantized once more; s + e is Gaussian-like with
  energy (1 + eps) ||s||^2, adding eps (1 + eps) ||s||^2 of error, uncorrelated with the
  first: NMSE_two ~ 2 eps, so two-shot / one-shot ~ 2 (we allow 1.7 .. 2.4; mxfp4's
  power-of-two scales make its ratio ~2.15).  With one rank the re-quantization sees an
  already-quantized tensor (same scales, values on the grid): the ratio is ~1.
* reduce-scatter and all-gather quantize once: ~ eps.
"""

from __future__ import annotations

import math

import pytest
import torch

from _comm_jobs import ALGOS, COMPRESSED
from distributed import run_job
from fp4quant import dequantize, quantize
from fp4quant.bench.error import nmse
from fp4quant.bench.tensors import make

WORLDS = (1, 2, 3, 4)


def codec_nmse(numel: int = 1 << 20, seeds: int = 3) -> dict[str, float]:
    """eps per compressed preset: the mean NMSE of one quantization of the benchmark's Gaussian
    tensors (fp4quant.bench.error's defaults: 2**20 values, seeds 0..2)."""
    tensors = [make("gaussian", numel, seed) for seed in range(seeds)]
    return {p: sum(nmse(dequantize(quantize(x, p)), x) for x in tensors) / seeds for p in COMPRESSED}


EPS = codec_nmse()


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"world{w}")
def suite(request):
    """Per-rank records of the whole suite on gloo with ``request.param`` ranks."""
    results = run_job("suite", request.param, timeout=150)
    for r in results:
        errors = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
        assert not errors, f"rank {r['rank']} raised:\n" + "\n".join(f"[{k}]\n{v}" for k, v in errors.items())
    return results


def on_all(suite, check):
    return [r[check] for r in suite]


pytestmark = pytest.mark.timeout(200)


def test_error_bounds_per_preset(suite):
    W = len(suite)
    for rec in on_all(suite, "errors"):
        for preset in COMPRESSED:
            one, two = rec[f"{preset}/one_shot"], rec[f"{preset}/two_shot"]
            eps = EPS[preset]
            assert one["identical"] and two["identical"], preset
            assert 0.85 * eps < one["nmse"] < 1.15 * eps, (preset, one["nmse"], eps)
            ratio = two["nmse"] / one["nmse"]
            lo, hi = (1.7, 2.4) if W > 1 else (0.95, 1.1)
            assert lo < ratio < hi, (preset, W, ratio)


def test_uncompressed_equals_torch_all_reduce(suite):
    for rec in on_all(suite, "uncompressed"):
        assert all(v["equal_torch"] and v["avg"] for v in rec.values()), rec


def test_avg_is_sum_over_world(suite):
    for rec in on_all(suite, "avg"):
        assert all(rec.values()), rec


def test_nan_and_inf_poison_their_group_on_every_rank(suite):
    for rec in on_all(suite, "nan"):
        for key, v in rec.items():
            assert v["region_nan"], f"{key}: a NaN/Inf micro-group decoded to finite values"
            assert v["rest_finite"], f"{key}: NaN leaked out of its micro-group"
            assert v["identical"], key


def test_a_sum_that_overflows_is_inf_as_uncompressed(suite):
    """float16 60000 on every rank: +-inf from 2 ranks on, as dist.all_reduce gives (one rank:
    the finite value back); float32 3e38 likewise; 1e37 sums fit and stay finite (no NaN)."""
    W = len(suite)
    for rec in on_all(suite, "overflow"):
        for key, v in rec.items():
            assert v["nan"] == 0, (key, v)
            assert v["inf_as_torch"], (key, v)
            overflows = not key.startswith("torch.float32/1e+37") and W > 1
            assert (v["ref_inf"] > 0) == overflows, (key, v)


def test_odd_and_empty_sizes(suite):
    eps = EPS["fp4quant"]
    for rec in on_all(suite, "sizes"):
        for key, v in rec.items():
            n = int(key.split("/")[1])
            if "shape" in v:
                assert v["shape"] == [n]
            if "identical" in v:
                assert v["identical"], key
            factor = 2 if key.endswith("two_shot") else 1
            # a few values give a noisy NMSE; thousands follow the bound
            bound = factor * eps * (5 if n < 100 else 1.2)
            assert v["nmse"] < bound, (key, v["nmse"], bound)


def test_half_precision_dtypes(suite):
    eps = EPS["fp4quant"]
    for rec in on_all(suite, "dtypes"):
        for key, v in rec.items():
            dtype, algo = key.split("/")
            assert v["dtype"] == dtype and v["identical"], key
            assert v["nmse"] < (2 if algo == "two_shot" else 1) * 1.2 * eps, (key, v["nmse"])


def test_noncontiguous_inputs(suite):
    for rec in on_all(suite, "noncontiguous"):
        for key, v in rec.items():
            assert v if isinstance(v, bool) else (v["strided"] and v["transposed"]), key


def test_explicit_process_groups(suite):
    if len(suite) == 1:
        pytest.skip("needs two ranks")
    for rank, rec in enumerate(on_all(suite, "groups")):
        for name, v in rec.items():
            if not v["member"]:
                assert v["unchanged"], (rank, name)
                continue
            assert v["identical"] and v["bf16_equal"], (rank, name)
            assert v["nmse"] < 2.4 * EPS["fp4quant"], (rank, name, v["nmse"])
            if "validate_error" in v:
                err = v["validate_error"]
                assert err and err["type"] == "ValueError" and "(global rank" in err["msg"], err


def test_validation_raises_on_every_rank(suite):
    W = len(suite)
    last = W - 1
    for rank, rec in enumerate(on_all(suite, "validation")):
        assert rec["fast_path_exchanges"] == 0, "the fast path must not exchange metadata"
        assert rec["validated_exchanges"] == 1 and rec["ok"] is None
        for key, field in (("dtype", "tensor.dtype"), ("config", "config.group"), ("op", "op"),
                           ("shape", "tensor.shape"), ("empty_vs_nonempty", "tensor.shape"), ("overlap", "overlap")):
            err = rec[key]
            if W == 1:
                assert err is None, (key, err)
                continue
            assert err and err["type"] == "ValueError", (rank, key, err)
            assert f"rank {last} differs" in err["msg"] and field in err["msg"], (rank, key, err)
        err = rec["int_validated"]
        if rank == last:
            assert err["type"] == "TypeError", err
        else:
            assert err["type"] == "ValueError" and f"rank {last} rejected" in err["msg"] and "TypeError" in err["msg"]
        err = rec["gather_shape"]
        if W > 1:
            assert err["type"] == "ValueError" and (rank == last or f"rank {last} rejected" in err["msg"]), err
        assert rec["int"]["type"] == "TypeError" and rec["int_uncompressed"]["type"] == "TypeError"
        assert rec["bad_op"]["type"] == "ValueError" and "op" in rec["bad_op"]["msg"]
        assert rec["bad_algorithm"]["type"] == "ValueError" and "algorithm" in rec["bad_algorithm"]["msg"]
        assert rec["bad_rs_shape"]["type"] == "ValueError"
        err = rec["stochastic_without_streams"]
        assert err["type"] == "ValueError" and "random streams" in err["msg"], err
        assert rec["in_step"], "ranks fell out of step after the argument errors"
        if rank == last:
            err = rec["validated_alone"]
            if W == 1:
                assert err is None, err
            else:
                assert err["type"] == "ValueError" and "did not validate this call" in err["msg"], err
                assert all(f"rank {r}" in err["msg"] for r in range(last)), err


def test_stats_counters(suite):
    W = len(suite)
    for rec in on_all(suite, "stats"):
        s, e = rec["stats"], rec["expected"]
        assert s["fwd"]["calls"] == 1 and s["bwd"]["calls"] == 3
        assert s["fwd"]["bytes_sent"] == e["fwd_sent"] and s["bwd"]["bytes_sent"] == e["bwd_sent"]
        assert s["fwd"]["bytes_uncompressed"] == e["fwd_uncompressed"]
        assert s["bwd"]["bytes_uncompressed"] == e["bwd_uncompressed"]
        assert s["fwd"]["quantize_s"] > 0 and s["fwd"]["dequantize_s"] > 0 and s["fwd"]["comm_s"] >= 0
        for key in ("fwd", "bwd"):  # the split codec timers sum to the codec's total
            assert s[key]["codec_s"] == pytest.approx(s[key]["quantize_s"] + s[key]["dequantize_s"], rel=1e-9)
        assert s["fwd"]["total_s"] >= s["fwd"]["codec_s"] + s["fwd"]["comm_s"]
        if W > 1:  # two-shot sends 2 (W-1)/W x 4.52 bits per value, the ring all-reduce 2 (W-1)/W x 32
            assert s["fwd"]["bytes_sent"] < s["fwd"]["bytes_uncompressed"] / 6
        assert rec["after_reset"] == {}


def test_stochastic_rounding_streams(suite):
    eps = EPS["fp4quant"]
    for rec in on_all(suite, "stochastic"):
        for algo in ALGOS:
            v = rec[algo]
            assert v["identical"], algo
            assert v["calls_differ"], "two calls reused the same random stream"
            # stochastic rounding is unbiased but noisier than round-to-nearest (~2x); its scales
            # round up, so even one rank's two-shot re-quantization lands on a new grid (2 errors)
            assert v["nmse"] < (2 if algo == "two_shot" else 1) * 2.5 * eps, (algo, v["nmse"])


def test_auto_algorithm(suite):
    for rec in on_all(suite, "auto"):
        assert rec["default_table"], rec
        assert all(v for k, v in rec.items() if k.startswith("set_table/")), rec


def test_chunked_pipeline(suite):
    for rec in on_all(suite, "chunked"):
        # block-local configs: chunk boundaries are block boundaries, so the bytes are the same
        assert rec["fp4quant/one_shot"]["equal_unchunked"] and rec["fp4quant/two_shot"]["equal_unchunked"]
        assert rec["all_gather"] and rec["reduce_scatter"]
        for key, v in rec.items():
            if isinstance(v, dict):
                assert v["identical"], key
                assert v["nmse"] < (2 if key.endswith("two_shot") and len(suite) > 1 else 1) * 1.2 * EPS["fp4quant"]


def test_all_gather_and_reduce_scatter(suite):
    for rec in on_all(suite, "gather_scatter"):
        for key, v in rec.items():
            if key in COMPRESSED:
                eps = EPS[key]
                assert v["all_gather_identical"], key
                assert 0.85 * eps < v["all_gather_nmse"] < 1.15 * eps, (key, v)
                assert 0.8 * eps < v["reduce_scatter_nmse"] < 1.2 * eps, (key, v)
            else:
                assert v["all_gather_exact"] and v["reduce_scatter_exact"] and v["reduce_scatter_avg"], (key, v)


def test_exchanges_match_torch_collectives(suite):
    if len(suite) == 1:
        pytest.skip("needs two ranks")
    for rank, rec in enumerate(on_all(suite, "exchange")):
        assert rec, rank
        errors = rec.pop("errors")
        for name, v in rec.items():
            # on gloo every exchange is receive-first point-to-point (fp4quant.comm.exchange)
            assert v == {"all_to_all": True, "all_gather": True, "sync": True, "point_to_point": True}, (rank, name, v)
        expected = {"scalar": "at least one dimension", "dtype": "output dtype torch.float32 but input dtype torch.uint8",
                    "numel": "output holds", "noncontiguous": "must be contiguous", "rows": "not a multiple of the world size"}
        for case, words in expected.items():
            err = errors[case]
            assert err and err["type"] == "ValueError" and words in err["msg"] and "\n" not in err["msg"], (case, err)


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("cuda_machine")
def test_nccl_suite():
    """The same checks on NCCL, one rank per visible GPU (skipped without a GPU)."""
    world = torch.cuda.device_count()
    results = run_job("suite", world, timeout=250, backend="nccl")
    for r in results:
        errors = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
        assert not errors, errors
        assert all(v["identical"] for v in r["errors"].values())
        for preset in COMPRESSED:
            assert r["errors"][f"{preset}/one_shot"]["nmse"] < 1.15 * EPS[preset]
        assert all(v["equal_torch"] for v in r["uncompressed"].values())
        # NCCL's own collectives: full duplex already
        assert all(v["all_to_all"] and v["all_gather"] and not v["point_to_point"]
                   for k, v in r["exchange"].items() if k != "errors")
    assert math.isfinite(results[0]["errors"]["fp4quant/two_shot"]["nmse"])
