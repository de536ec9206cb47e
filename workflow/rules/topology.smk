# Topology: the projection as a table (cluster x TP x algorithm, projected), the same
# algorithms measured where the configuration runs on GPU nodes (topology.measure), and the
# model checked on two emulated nodes of two ranks each (`snakemake topology_emulated`).

TOPOLOGY = config.get("topology", {})


rule topology_benchmark:
    """On real GPU nodes: NCCL's BF16 all-reduce beside flat and hierarchical FP4 (and the
    uncompressed hierarchy) at the launcher's node layout, BF16 input."""
    input:
        rules.build_extension.output.info,
    output:
        csv=f"{OUT}/bench/topology.csv",
    log:
        f"{OUT}/logs/topology_benchmark.log",
    params:
        launch=launcher(),
        sizes=q("--sizes", TOPOLOGY.get("sizes", [4 << 20, 16 << 20, 64 << 20])),
    threads: workflow.cores
    shell:
        "{params.launch} -m fp4quant.bench.allreduce_sweep --presets fp4quant --algorithms two_shot hierarchical"
        " --dtype bfloat16 --no-chunk-sweep --chunk-bytes 0 --iters 5 --min-iters 5 --budget-mib 4096"
        " {params.sizes} --out {output.csv:q} > {log:q} 2>&1"


rule projection_clusters:
    """The projection by topology (projected by fp4quant.perfmodel.topology; nothing measured
    unless topology.measure: then the nodes' own all-reduces are added as rows)."""
    input:
        rules.build_extension.output.info,
        measured=rules.topology_benchmark.output.csv if TOPOLOGY.get("measure") else [],
    output:
        f"{OUT}/results/projection_clusters.csv",
    log:
        f"{OUT}/logs/projection_clusters.log",
    params:
        measured=lambda wc, input: q("--measured", input.measured) if TOPOLOGY.get("measure") else "",
    shell:
        "{PY:q} -m fp4quant.perfmodel.topology --out {output:q} {params.measured} 2> {log:q}"


if EMULATED:  # the emulated cluster's calibration is its input

    rule topology_emulated:
        """Two emulated nodes of two ranks (network namespaces, the calibration's shaped link between
        them, loopback inside): gloo's BF16 all-reduce, flat and hierarchical FP4 and the uncompressed
        hierarchy at 4-64 MiB, 5 iterations each, and the model's prediction of each (minutes)."""
        input:
            cal=rules.cluster_calibration.output,
            link=rules.cluster_collectives.output.csv,
        output:
            bench=f"{OUT}/cluster/topology.csv",
            record=f"{OUT}/cluster/topology.cluster.json",
            validation=f"{OUT}/results/topology_validation.csv",
        log:
            f"{OUT}/logs/topology_emulated.log",
        threads: workflow.cores
        shell:
            "{PY:q} -m fp4quant.cluster run --calibration {input.cal:q} --nodes 2 --nproc-per-node 2"
            " --record {output.record:q} -- -m fp4quant.bench.allreduce_sweep --presets fp4quant"
            " --algorithms two_shot hierarchical --sizes 4194304 16777216 67108864 --iters 5 --min-iters 5"
            " --budget-mib 2048 --dtype bfloat16 --no-chunk-sweep --chunk-bytes 0 --out {output.bench:q} > {log:q} 2>&1"
            " && {PY:q} -m fp4quant.perfmodel.topology"
            " --emulated {output.bench:q} --calibration {input.cal:q} --link-collectives {input.link:q}"
            " --emulated-out {output.validation:q} >> {log:q} 2>&1"
