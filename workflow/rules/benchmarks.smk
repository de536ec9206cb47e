# Codec error, kernel throughput and collective latency.  Timed rules take every core
# (threads: workflow.cores), so no other job runs beside them and skews the timings.


rule error_benchmark:
    input:
        rules.build_extension.output.info,
    output:
        csv=f"{OUT}/bench/error.csv",
    log:
        f"{OUT}/logs/error_benchmark.log",
    params:
        # what the configuration leaves out takes the benchmark's own defaults (--numel, --seeds)
        sizes=("--numel 65536 --seeds 1" if QUICK else q(
            [word for key, flag in (("error_numel", "numel"), ("error_seeds", "seeds"))
             if config["bench"].get(key) is not None for word in (f"--{flag}", config["bench"][key])])),
    shell:
        "{PY:q} -m fp4quant.bench.error --out {output.csv:q} {params.sizes} 2> {log:q}"


rule kernel_benchmark:
    input:
        rules.build_extension.output.info,
    output:
        csv=f"{OUT}/bench/kernels.csv",
    log:
        f"{OUT}/logs/kernel_benchmark.log",
    params:
        device=config["bench"]["kernels_device"],
        quick="--quick" if QUICK else "",
        max_mib=q("--max-mib", config["bench"]["kernels_max_mib"]) if config["bench"].get("kernels_max_mib") else "",
    threads: workflow.cores
    shell:
        "{PY:q} -m fp4quant.bench.kernels --device {params.device:q} --out {output.csv:q} {params.quick}"
        " {params.max_mib} 2> {log:q}"


rule collective_benchmark:
    input:
        rules.build_extension.output.info,
    output:
        csv=f"{OUT}/bench/collectives.csv",
    log:
        f"{OUT}/logs/collective_benchmark.log",
    params:
        launch=launcher(config["bench"].get("collectives_nproc", 2)),
        quick="--quick" if QUICK else "",
        presets=q("--presets", config["bench"]["collective_presets"])
        if config["bench"].get("collective_presets") else "",
        sizes=q("--sizes", config["bench"]["collective_sizes"]) if config["bench"].get("collective_sizes") else "",
    threads: workflow.cores
    shell:
        "{params.launch} -m fp4quant.bench.allreduce_sweep --out {output.csv:q} {params.quick} {params.presets}"
        " {params.sizes} > {log:q} 2>&1"
