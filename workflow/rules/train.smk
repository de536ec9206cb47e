# Tokenized data, then one training run per TP communication preset and seed (the
# end-to-end runs and the ablations), each in data/<profile>/runs/<model>/<comm>/seed<seed>/.


rule prepare_data:
    output:
        meta=f"{OUT}/tokens/meta.json",
    log:
        f"{OUT}/logs/prepare_data.log",
    params:
        inputs=q("--input", config["data"]["inputs"]) if config.get("data", {}).get("inputs") else "",
        tokenizer=q("--tokenizer", config["data"]["tokenizer"]) if config.get("data", {}).get("tokenizer") else "",
        provenance=ROOT_KEY,  # the tokenizer is code too
    shell:
        "{PY:q} -m fp4quant.data prepare --out {OUT:q}/tokens {params.inputs} {params.tokenizer} 2> {log:q}"


# The training options the configuration may set; those it leaves out take the trainer's
# defaults (fp4quant.train.TrainConfig: the one place they are stated), so none is repeated here.
TRAIN_OPTIONS = ("model", "tp", "compress", "algorithm", "steps", "seq_len", "batch_size", "lr", "checkpoint_every",
                 "eval_batches", "sequence_parallel", "activation_checkpointing")


def train_args(wildcards, train=None):
    """The trainer's flags for a run (``train``: the options, default the configuration's train),
    shell-quoted."""
    train = TRAIN if train is None else train
    # a run folder "<comm>[@<compress>][+<compute>]" (fp4quant.train.train_config.run_name)
    comm, compress, compute = parse_run_name(wildcards.comm)
    flags = ["--comm", comm, "--seed", wildcards.seed, "--data", f"{OUT}/tokens"]
    if compute != "exact":
        flags += ["--compute", compute]
    if compress != "both":  # the run's own directions, over train.compress
        flags += ["--compress", compress]
    for key in TRAIN_OPTIONS:
        value = train.get(key)
        if key == "compress" and compress != "both":
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            flags += [flag, value]
    if config["launcher"].get("device") is not None:
        flags += ["--device", config["launcher"]["device"]]
    return q(flags)


rule train:
    input:
        data=rules.prepare_data.output.meta,
        build=rules.build_extension.output.info,
    output:
        summary=f"{OUT}/runs/{MODEL}/{{comm}}/seed{{seed}}/summary.json",
        log=f"{OUT}/runs/{MODEL}/{{comm}}/seed{{seed}}/log.jsonl",
    log:
        f"{OUT}/logs/train_{{comm}}_seed{{seed}}.log",
    params:
        launch=launcher(),
        args=train_args,
        run=lambda wc: run_dir(wc.comm, wc.seed),
        fresh=lambda wc, input: fresh_run(wc, f"{launcher()} {train_args(wc)}", input),
    threads: workflow.cores
    shell:
        # resumes from the run folder's last checkpoint when rerun after an interruption
        "{params.fresh} > {log:q} 2>&1"
        " && {params.launch} -m fp4quant.train {params.args} --out {params.run:q} >> {log:q} 2>&1"
