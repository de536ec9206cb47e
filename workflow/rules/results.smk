# Every raw log into tidy CSVs (data/<profile>/results/), and one target per ablation.


rule collect_results:
    input:
        runs=[f"{d}/summary.json" for d in RUN_DIRS],
        error=rules.error_benchmark.output.csv,
        kernels=rules.kernel_benchmark.output.csv,
        collectives=rules.collective_benchmark.output.csv,
        tests=rules.unit_tests.output.junit,
        cluster=[f"{OUT}/cluster/collectives.csv", f"{OUT}/cluster/collectives.cluster.json"] if EMULATED else [],
    output:
        expand(f"{OUT}/results/{{name}}.csv", name=["training", "curves", "error", "kernels", "collectives", "ablation"] + (["collectives_emulated"] if EMULATED else [])),
    log:
        f"{OUT}/logs/collect_results.log",
    params:
        runs=RUN_DIRS,
        ablations=ABLATIONS,
        cluster=q("--cluster-collectives", f"{OUT}/cluster/collectives.csv",
                  "--cluster-record", f"{OUT}/cluster/collectives.cluster.json") if EMULATED else "",
    shell:
        "{PY:q} -m fp4quant.analysis collect --profile {PROFILE:q} --runs {params.runs:q} --error {input.error:q}"
        " --kernels {input.kernels:q} --collectives {input.collectives:q} --ablations {params.ablations:q}"
        " {params.cluster} --out-dir {OUT:q}/results 2> {log:q}"


rule projection_sensitivity:
    """The H100 projection swept over each of its assumptions (projected by the step model, no
    measurement; after the build so that a new commit reruns it with everything else)."""
    input:
        rules.build_extension.output.info,
    output:
        f"{OUT}/results/projection_sensitivity.csv",
    log:
        f"{OUT}/logs/projection_sensitivity.log",
    shell:
        "{PY:q} -m fp4quant.perfmodel.sensitivity --out {output:q} 2> {log:q}"


def ablation_rule(name):
    """`snakemake ablation_<name>`: the codec error, kernel speed and training run of one
    ablation beside the full method's, as data/<profile>/results/ablation_<name>.csv."""

    rule:
        name:
            f"ablation_{name}"
        input:
            runs=[f"{run_dir(c, s)}/summary.json" for c in ("fp4quant", name) for s in seeds_of(c)],
            error=rules.error_benchmark.output.csv,
            kernels=rules.kernel_benchmark.output.csv,
        output:
            f"{OUT}/results/ablation_{name}.csv",
        log:
            f"{OUT}/logs/ablation_{name}.log",
        params:
            name=name,
            runs=[run_dir(c, s) for c in ("fp4quant", name) for s in seeds_of(c)],
        shell:
            "{PY:q} -m fp4quant.analysis ablation {params.name:q} --profile {PROFILE:q} --runs {params.runs:q}"
            " --error {input.error:q} --kernels {input.kernels:q} --out {output:q} 2> {log:q}"


def kernel_ablation_rule(name):
    """`snakemake ablation_<name>` of an ablation that sends fp4quant's bytes (naive_pack): the
    kernel benchmark's rows of both packings and the speed of fp4quant's over them, as
    data/<profile>/results/ablation_<name>.csv (no training run: it would be fp4quant's)."""

    rule:
        name:
            f"ablation_{name}"
        input:
            kernels=rules.kernel_benchmark.output.csv,
        output:
            f"{OUT}/results/ablation_{name}.csv",
        log:
            f"{OUT}/logs/ablation_{name}.log",
        params:
            name=name,
        shell:
            "{PY:q} -m fp4quant.analysis ablation {params.name:q} --profile {PROFILE:q} --kernels {input.kernels:q}"
            " --out {output:q} 2> {log:q}"


for _name in ABLATIONS:
    (kernel_ablation_rule if _name in KERNEL_ABLATIONS else ablation_rule)(_name)
