# The step model checked part by part (fp4quant.perfmodel.model_validation): at each link rate of
# cluster.validation, a probe of the ranks and the link (fp4quant.perfmodel.probe), short
# training runs on that link and a bracketing probe (--gaps-from: the probe's gapped steps
# again, so that the model's per-step inputs are the mean of before and after the runs), back
# to back, then measured vs predicted compute, codec, communication and total per
# configuration -> results/model_validation.csv.  Before each comm's run, its latency run:
# the trainer on the same link with cluster.validation.latency_batch_size sequences a step (unset: half the runs')
# (other bytes than the run), whose communication gives the model's latency per wire step
# (fp4quant.perfmodel.model_validation: the probe's own collectives met the link more slowly than the
# trainer's, by an amount that moved from probe to probe).  With
# cluster.validation.repeats > 1 every link's probe and runs are repeated (repeat<k>/), each
# repeat a row of its own: the spread of the errors is the machine's drift between a probe
# and the runs it predicts.

VALIDATION = CLUSTER.get("validation", {})
VRATES = [f"{r:g}" for r in VALIDATION.get("rates_mbit", [30, 60, 120])]
VCOMMS = VALIDATION.get("comms", ["bf16", "fp4quant"])
VREPEATS = list(range(1, int(VALIDATION.get("repeats", 1)) + 1))
VDIR = f"{OUT}/cluster/validation"
# the latency runs' sequences a step: as asked, else half the runs' (2 where the runs take 1)
VLATENCY_BATCH = int(VALIDATION.get("latency_batch_size") or (TRAIN["batch_size"] // 2 or 2))
if EMULATED and VLATENCY_BATCH == int(TRAIN["batch_size"]):  # validated on the emulated cluster only
    raise ValueError(f"cluster.validation.latency_batch_size ({VLATENCY_BATCH}) must differ from train.batch_size: "
                     f"a latency run with the runs' own bytes would echo them, not predict them")


def validation_train(repeat, rate, comm, latency=False):
    run = f"{VDIR}/repeat{repeat}/rate{rate}/" + (f"latency/{comm}" if latency else comm)
    batch = VLATENCY_BATCH if latency else TRAIN["batch_size"]
    return q("rm", "-rf", run) + " && " + q(
        PY, "-m", "fp4quant.cluster", "run", "--rate-mbit", rate, "--nodes", NODES, "--nproc-per-node",
        TRAIN["tp"] // NODES, "--record", f"{run}/cluster.json", "--", "-m", "fp4quant.train",
        "--model", TRAIN["model"], "--tp", TRAIN["tp"], "--comm", comm, "--steps", VALIDATION.get("steps", 30),
        "--seq-len", TRAIN["seq_len"], "--batch-size", batch, "--data", f"{OUT}/tokens", "--eval-batches", 0,
        "--checkpoint-every", 1000000, "--device", "cpu", "--out", run)


def validation_probe(rate, cluster_args, probe_args):
    """The probe at one link rate (``cluster_args``, ``probe_args``: lists of further words)."""
    return q(PY, "-m", "fp4quant.cluster", "run", "--rate-mbit", rate, "--nodes", NODES, cluster_args, "--",
             "-m", "fp4quant.perfmodel.probe", "--model", TRAIN["model"], "--seq-len", TRAIN["seq_len"],
             "--batch-size", TRAIN["batch_size"], probe_args)


# One job per link rate: its probe, its runs, its bracketing probe, back to back, so that the
# model's inputs and the runs it predicts are measured under the same load of this shared machine.
rule validation_rate:
    input:
        rules.build_extension.output.info,
        data=rules.prepare_data.output.meta,
    output:
        probe=f"{VDIR}/repeat{{repeat}}/rate{{rate}}/probe.json",
        record=f"{VDIR}/repeat{{repeat}}/rate{{rate}}/probe.cluster.json",
        after=f"{VDIR}/repeat{{repeat}}/rate{{rate}}/probe_after.json",
        runs=[f"{VDIR}/repeat{{repeat}}/rate{{rate}}/{c}/summary.json" for c in VCOMMS],
        latency=[f"{VDIR}/repeat{{repeat}}/rate{{rate}}/latency/{c}/summary.json" for c in VCOMMS],
    log:
        f"{OUT}/logs/validation_{{repeat}}_{{rate}}.log",
    params:
        runs=lambda wc: " && ".join(validation_train(wc.repeat, wc.rate, c, latency) for c in VCOMMS
                                    for latency in (True, False)),
        probe=lambda wc, output: validation_probe(wc.rate, ["--record", output.record], ["--out", output.probe]),
        after=lambda wc, output: validation_probe(wc.rate, [], ["--gaps-from", output.probe, "--out", output.after]),
    threads: workflow.cores
    shell:
        "({params.probe} && {params.runs} && {params.after}) > {log:q} 2>&1"


rule model_validation:
    input:
        probes=expand(f"{VDIR}/repeat{{repeat}}/rate{{rate}}/probe{{when}}.json", repeat=VREPEATS, rate=VRATES,
                      when=["", "_after"]),
        runs=expand(f"{VDIR}/repeat{{repeat}}/rate{{rate}}/{{comm}}/summary.json", repeat=VREPEATS, rate=VRATES,
                    comm=VCOMMS),
        latency=expand(f"{VDIR}/repeat{{repeat}}/rate{{rate}}/latency/{{comm}}/summary.json", repeat=VREPEATS,
                       rate=VRATES, comm=VCOMMS),
    output:
        f"{OUT}/results/model_validation.csv",
    log:
        f"{OUT}/logs/model_validation.log",
    params:
        cases=q([w for k in VREPEATS for r in VRATES for d in [f"{VDIR}/repeat{k}/rate{r}"]
                 for w in ["--case", f"{d}/probe.json", f"{d}/probe_after.json"]
                 + [p for c in VCOMMS for p in (f"latency:{d}/latency/{c}", f"{d}/{c}")]]),
    shell:
        "{PY:q} -m fp4quant.perfmodel.model_validation {params.cases} --out {output:q} 2> {log:q}"
