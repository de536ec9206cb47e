# Throughput: the tokens/s of the end-to-end table and figure (throughput.csv), and the step's
# regime, each component's share of it on the target and on the emulated cluster (regime.csv).
# With the emulated cluster they come from the throughput runs (cluster.smk: cluster_train, at
# cluster.throughput's shape, chosen with `python -m fp4quant.perfmodel.regime shapes` so that
# the step splits as the target's); without it, from the training runs of the compared presets.

THROUGHPUT_RUNS = THROUGHPUT_DIRS if EMULATED else [run_dir(c, s) for c in TRAIN["comms"] for s in TRAIN["seeds"]]
# steps left out of a run's tokens/s: the configured warm-up, else the trainer's (the first tenth)
THROUGHPUT_WARMUP = THROUGHPUT["warmup_steps"] if EMULATED else TRAIN["steps"] // 10


rule collect_throughput:
    input:
        [f"{d}/summary.json" for d in THROUGHPUT_RUNS],
    output:
        f"{OUT}/results/throughput.csv",
        f"{OUT}/results/breakdown.csv",
    log:
        f"{OUT}/logs/collect_throughput.log",
    params:
        runs=THROUGHPUT_RUNS,
    shell:
        "{PY:q} -m fp4quant.analysis throughput --profile {PROFILE:q} --runs {params.runs:q}"
        " --warmup {THROUGHPUT_WARMUP:q} --out {output[0]:q} --breakdown-out {output[1]:q} 2> {log:q}"


rule regime:
    input:
        cal=rules.cluster_calibration.output,
        runs=[f"{d}/summary.json" for d in THROUGHPUT_DIRS],
    output:
        f"{OUT}/results/regime.csv",
    log:
        f"{OUT}/logs/regime.log",
    params:
        runs=THROUGHPUT_DIRS,
    shell:
        "{PY:q} -m fp4quant.perfmodel.regime table --calibration {input.cal:q} --runs {params.runs:q}"
        " --warmup {THROUGHPUT_WARMUP:q} --out {output:q} 2> {log:q}"
