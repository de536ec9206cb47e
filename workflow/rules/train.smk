# Tokenized data, then one training run per TP communication preset and seed (the
# end-to-end runs and the ablations), each in data/<profile>/runs/<model>/<comm>/seed<seed>/.


rule prepare_data:
    output:
        meta=f"{OUT}/tokens/meta.json",
    log:
        f"{OUT}/logs/prepare_data.log",
    params:
        inputs=("--input " + " ".join(config.get("data", {}).get("inputs", []))) if config.get("data", {}).get("inputs") else "",
        tokenizer=config.get("data", {}).get("tokenizer", "bytes"),
        provenance=PROVENANCE_KEY,  # the tokenizer is code too
    shell:
        "{PY} -m fp4quant.data prepare --out {OUT}/tokens {params.inputs} --tokenizer {params.tokenizer} 2> {log}"


def train_args(wildcards):
    t = TRAIN
    flags = [
        f"--model {t['model']}", f"--tp {t['tp']}", f"--comm {wildcards.comm}", f"--compress {t.get('compress', 'both')}",
        f"--algorithm {t.get('algorithm', 'two_shot')}", f"--steps {t['steps']}", f"--seq-len {t['seq_len']}",
        f"--batch-size {t['batch_size']}", f"--lr {t.get('lr', 0.003)}", f"--seed {wildcards.seed}",
        f"--checkpoint-every {t.get('checkpoint_every', 100)}", f"--eval-batches {t.get('eval_batches', 8)}",
        f"--device {config['launcher'].get('device', 'auto')}", f"--data {OUT}/tokens",
    ]
    if t.get("sequence_parallel"):
        flags.append("--sequence-parallel")
    if t.get("activation_checkpointing"):
        flags.append("--activation-checkpointing")
    return " ".join(flags)


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
        "{params.fresh} > {log} 2>&1 && {params.launch} -m fp4quant.train {params.args} --out {params.run} >> {log} 2>&1"
