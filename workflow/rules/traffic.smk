# The codec on the tensors that cross the wire: a short BF16 run (bench.traffic_model, tiny by
# default: a large model's traffic is GBs per step) saves its TP traffic at three steps
# (--capture-traffic-steps), and bench.traffic measures every preset, the FWHT's size and the
# 4-over-6 scale choice on it.
TRAFFIC_STEPS = 6 if QUICK else config["bench"]["traffic_steps"]
TRAFFIC_MODEL = config["bench"]["traffic_model"]
TRAFFIC_TP = config["bench"]["traffic_tp"]
TRAFFIC_RUN = f"{OUT}/traffic/{TRAFFIC_MODEL.rstrip('/').split('/')[-1]}"


rule traffic_capture:
    input:
        data=rules.prepare_data.output.meta,
        build=rules.build_extension.output.info,
    output:
        summary=f"{TRAFFIC_RUN}/summary.json",
    log:
        f"{OUT}/logs/traffic_capture.log",
    params:
        launch=launcher(TRAFFIC_TP),
        args=q("--model", TRAFFIC_MODEL, "--tp", TRAFFIC_TP,
               [w for k in ("seq_len", "batch_size") if k in TRAIN for w in (f"--{k.replace('_', '-')}", TRAIN[k])],
               ["--device", config["launcher"]["device"]] if config["launcher"].get("device") else []),
        capture=f"1,{TRAFFIC_STEPS // 2},{TRAFFIC_STEPS - 1}",
    threads: workflow.cores
    shell:
        "rm -rf {TRAFFIC_RUN:q} && {params.launch} -m fp4quant.train {params.args} --comm bf16"
        " --steps {TRAFFIC_STEPS:q} --capture-traffic-steps {params.capture:q} --checkpoint-every {TRAFFIC_STEPS:q}"
        " --keep-checkpoints 1 --eval-batches 0 --data {OUT:q}/tokens --out {TRAFFIC_RUN:q} > {log:q} 2>&1"


rule traffic_benchmark:
    input:
        rules.traffic_capture.output.summary,
    output:
        csv=f"{OUT}/bench/traffic.csv",
        summary=f"{OUT}/bench/traffic_summary.csv",
    log:
        f"{OUT}/logs/traffic_benchmark.log",
    shell:
        "{PY:q} -m fp4quant.bench.traffic --captures {TRAFFIC_RUN:q}/traffic --out {output.csv:q} 2> {log:q}"


rule traffic_figure:
    input:
        rules.traffic_benchmark.output.csv,
    output:
        "figures/traffic.pdf",
    log:
        f"{OUT}/logs/figure_traffic.log",
    shell:
        "{PY:q} -m fp4quant.analysis figure traffic --results {OUT:q}/bench --profile {PROFILE:q} --out {output:q}"
        " --inputs {input:q} 2> {log:q}"
