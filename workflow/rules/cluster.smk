# The scale model of a multi-node cluster (fp4quant.cluster): calibration, the collective
# benchmark and the throughput runs (throughput.smk) on emulated nodes joined by shaped links,
# and the performance model's validation and H100 projection.  Without root or iproute2 the runs
# fall back to loopback, say so in one line, and record it (cluster.json) for the figures.

CDIR = f"{OUT}/cluster"
CLUSTER_SIZES = CLUSTER.get("collective_sizes", [4096, 65536, 1048576, 16777216, 67108864])
PREDICTED_SIZE = max(CLUSTER_SIZES)  # the all-reduce whose speedup allreduce_prediction predicts
TRANSFER_SIZES = [s for s in (65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20) if s < PREDICTED_SIZE] + [PREDICTED_SIZE]


rule cluster_calibration:
    input:
        rules.build_extension.output.info,
    output:
        f"{CDIR}/calibration.json",
    log:
        f"{OUT}/logs/cluster_calibration.log",
    threads: workflow.cores
    shell:  # at the throughput runs' shape: the FLOP/s, so the dilation, depend on it
        "{PY:q} -m fp4quant.cluster calibrate --model {TRAIN[model]:q} --seq-len {THROUGHPUT[seq_len]:q}"
        " --batch-size {THROUGHPUT[batch_size]:q} --tp {TRAIN[tp]:q} --out {output:q} 2> {log:q}"


# 20 timed iterations (fewer above 3 MiB: --budget-mib, but at least 5 for the figure's
# min-max band): the performance model takes the link's per-step latency from the median
# 4 KiB all-reduce, which 3 iterations left anywhere between 0.5 and 3.6 ms on this VM.
rule cluster_collectives:
    input:
        cal=rules.cluster_calibration.output,
    output:
        csv=f"{CDIR}/collectives.csv",
        record=f"{CDIR}/collectives.cluster.json",
    log:
        f"{OUT}/logs/cluster_collectives.log",
    params:
        sizes=CLUSTER_SIZES,
    threads: workflow.cores
    shell:
        "{PY:q} -m fp4quant.cluster run --calibration {input.cal:q} --nodes {NODES:q} --record {output.record:q} --"
        " -m fp4quant.bench.allreduce_sweep --out {output.csv:q} --dtype bfloat16 --sizes {params.sizes:q}"
        " --presets fp4quant --algorithms two_shot --no-chunk-sweep --iters 20 --min-iters 5 --budget-mib 64"
        " > {log:q} 2>&1"


# The link alone (nothing dilated) on the same calibrated link: the rate by size of gloo's ring
# all_reduce and of the compressed collectives' exchanges (fp4quant.comm.exchange), from which
# fp4quant.perfmodel.allreduce predicts the emulated all-reduce's speedup at the largest
# collective size (at 64 MiB its BF16 ring sends 64 MiB a rank, its two-shot phases 9.5 MB,
# or 0.6 MB a chunk).  Both up to a quarter of that size: the ring's rate per byte is flat by
# then (4.911 MB/s at 16 MiB, 4.928 at 64 MiB at efe567a on the 2-core EPYC), and its 64 MiB
# calls (80 s of the run) would time the very all-reduce that is predicted.
rule cluster_transfers:
    input:
        cal=rules.cluster_calibration.output,
    output:
        ring=f"{CDIR}/transfers_ring.csv",  # all_reduce, up to a quarter of the all-reduce's bytes
        phases=f"{CDIR}/transfers.csv",  # two-shot's primitives, as far (a phase is 0.14 of them)
        record=f"{CDIR}/transfers.cluster.json",
    log:
        f"{OUT}/logs/cluster_transfers.log",
    params:
        sizes=[s for s in TRANSFER_SIZES if s <= PREDICTED_SIZE // 4] or [PREDICTED_SIZE // 4],
        run=q(PY, "-m", "fp4quant.cluster", "run", "--nodes", NODES, "--link-only"),
    threads: workflow.cores
    shell:
        "({params.run} --calibration {input.cal:q} --record {output.record:q} -- -m fp4quant.bench.transfers"
        " --out {output.ring:q} --iters 5 --sizes {params.sizes:q} --primitives all_reduce"
        " && {params.run} --calibration {input.cal:q} -- -m fp4quant.bench.transfers --out {output.phases:q} --iters 5"
        " --sizes {params.sizes:q} --primitives exchange_all_to_all exchange_all_gather) > {log:q} 2>&1"


rule allreduce_prediction:
    input:
        collectives=rules.cluster_collectives.output.csv,
        record=rules.cluster_collectives.output.record,
        transfers=[rules.cluster_transfers.output.ring, rules.cluster_transfers.output.phases],
    output:
        f"{OUT}/results/allreduce_prediction.csv",
    log:
        f"{OUT}/logs/allreduce_prediction.log",
    shell:
        "{PY:q} -m fp4quant.perfmodel.allreduce --collectives {input.collectives:q} --record {input.record:q}"
        " --transfers {input.transfers:q} --size {PREDICTED_SIZE:q} --out {output:q} 2> {log:q}"


# A throughput run: a few steps of the throughput shape (throughput.smk) on the emulated cluster.
rule cluster_train:
    input:
        cal=rules.cluster_calibration.output,
        data=rules.prepare_data.output.meta,
    output:
        summary=f"{CDIR}/throughput/{MODEL}/{{comm}}/seed{{seed}}/summary.json",
        log=f"{CDIR}/throughput/{MODEL}/{{comm}}/seed{{seed}}/log.jsonl",
        record=f"{CDIR}/throughput/{MODEL}/{{comm}}/seed{{seed}}/cluster.json",
    log:
        f"{OUT}/logs/cluster_train_{{comm}}_seed{{seed}}.log",
    params:
        args=lambda wc: throughput_args(wc),
        run=lambda wc: throughput_dir(wc.comm, wc.seed),
        nproc=lambda wc: TRAIN["tp"] // NODES,
        fresh=lambda wc, input: fresh_run(wc, f"cluster --nodes {NODES} {throughput_args(wc)}", input, throughput_dir),
    threads: workflow.cores
    shell:
        "{params.fresh} > {log:q} 2>&1 && {PY:q} -m fp4quant.cluster run --calibration {input.cal:q} --nodes {NODES:q}"
        " --nproc-per-node {params.nproc:q} --record {output.record:q} -- -m fp4quant.train {params.args}"
        " --out {params.run:q} >> {log:q} 2>&1"


rule projection:
    input:
        cal=rules.cluster_calibration.output,
        collectives=rules.cluster_collectives.output.csv,
        runs=[f"{d}/summary.json" for d in THROUGHPUT_DIRS],
    output:
        f"{OUT}/results/projection.csv",
    log:
        f"{OUT}/logs/projection.log",
    params:
        runs=THROUGHPUT_DIRS,
        gpu=q("--gpu-kernels", CLUSTER["gpu_kernels"]) if CLUSTER.get("gpu_kernels") else "",
    shell:
        "{PY:q} -m fp4quant.perfmodel --calibration {input.cal:q} --collectives {input.collectives:q}"
        " --runs {params.runs:q} --warmup {THROUGHPUT_WARMUP:q} {params.gpu} --out {output:q} 2> {log:q}"
