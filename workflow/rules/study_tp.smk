# The convergence study at TP 2 to 16 (workflow/config/study_tp.yaml): every run of train.comms x
# study_tp.tps x its seeds on simulated ranks, the controls, the TP-degree traffic's SQNR, and
# their results (data/<profile>/results/tp_summary.{csv,md}) and figures (loss_gap_tp.pdf,
# sqnr_tp.pdf under data/<profile>/figures/).
#   snakemake --cores all study_tp --configfile workflow/config/study_tp.yaml
#   snakemake --cores all study_tp_batch1 --configfile workflow/config/study_tp.yaml

from types import SimpleNamespace

STUDY_TP = config.get("study_tp")
if STUDY_TP:
    TP_THREADS = STUDY_TP.get("threads_per_run", 1)
    TP_RESULTS = f"{OUT}/results"

    def tp_run_dir(tp, comm, seed):
        return f"{OUT}/tp_runs/{MODEL}/tp{tp}/{comm}/seed{seed}"

    def tp_seeds(comm):
        return STUDY_TP.get("seeds", {}).get(comm, TRAIN["seeds"])

    def tp_runs(tps, comms):
        return [tp_run_dir(tp, c, s) for tp in tps for c in comms for s in tp_seeds(c)]

    def tp_control_runs():
        return [tp_run_dir(c["tp"], c["comm"], s) for c in STUDY_TP.get("controls", [])
                for s in c.get("seeds", TRAIN["seeds"])]

    TP_ALL_RUNS = tp_runs(STUDY_TP["tps"], TRAIN["comms"]) + tp_control_runs()
    # the SQNR against TP: each degree's BF16 run of seed 0 saves its traffic
    TP_TRAFFIC_RUNS = {tp: tp_run_dir(tp, "bf16", min(tp_seeds("bf16"))) for tp in STUDY_TP["tps"]}

    def tp_train_args(wildcards):
        """The trainer's flags of one run: the configuration's train options at the run's TP
        degree (ranks simulated from 2 on); bf16-alone is --comm bf16 --rounding-alone."""
        tp, comm = int(wildcards.tp), wildcards.comm
        alone = comm.endswith("-alone")
        flags = train_args(SimpleNamespace(comm=comm.removesuffix("-alone"), seed=wildcards.seed), {**TRAIN, "tp": tp})
        extra = ["--simulate-tp"] if tp > 1 else []
        extra += ["--rounding-alone"] if alone else []
        run = tp_run_dir(tp, comm, wildcards.seed)
        if TP_TRAFFIC_RUNS.get(tp) == run:
            extra += ["--capture-traffic-steps", STUDY_TP["traffic_steps"]]
        return flags + " " + q(extra) if extra else flags

    rule tp_train:
        input:
            data=rules.prepare_data.output.meta,
            build=rules.build_extension.output.info,
        output:
            summary=f"{OUT}/tp_runs/{MODEL}/tp{{tp}}/{{comm}}/seed{{seed}}/summary.json",
        log:
            f"{OUT}/logs/tp_train_tp{{tp}}_{{comm}}_seed{{seed}}.log",
        wildcard_constraints:
            tp=r"\d+",
            seed=r"\d+",
        params:
            args=tp_train_args,
            run=lambda wc: tp_run_dir(wc.tp, wc.comm, wc.seed),
            # the runs' inputs as fresh_run hashes them: the tokens alone (their training code is in
            # ROOT_KEY); meta.json and info.json carry the commit and time of the rerun that wrote them
            fresh=lambda wc: fresh_run(wc, f"tp_train {tp_train_args(wc)}", [f"{OUT}/tokens/tokens.bin"],
                                       folder=lambda comm, seed: tp_run_dir(wc.tp, comm, seed)),
        threads: TP_THREADS
        shell:
            # one process: its ranks are threads (--simulate-tp); resumes after an interruption
            "{params.fresh} > {log:q} 2>&1"
            " && OMP_NUM_THREADS={threads} {PY:q} -m fp4quant.train {params.args} --out {params.run:q} >> {log:q} 2>&1"

    TP_BATCHES = [tp_control_runs() if b.get("controls") else tp_runs(b.get("tps", []), b.get("comms", []))
                  for b in STUDY_TP.get("batches") or [{"tps": STUDY_TP["tps"], "comms": TRAIN["comms"]},
                                                       {"controls": True}]]
    # the runs the results cover: every run, or the batches results_batches names (the first batches,
    # or those complete, built and frozen while the others gather; workflow/config/study_tp_batch*.yaml)
    _chosen = STUDY_TP.get("results_batches")
    if _chosen is not None:
        _unknown = sorted(set(_chosen) - set(range(1, len(TP_BATCHES) + 1)))
        if _unknown:
            raise SystemExit(f"config error: study_tp.results_batches names batch {', '.join(map(str, _unknown))}, "
                             f"but the study has batches 1 .. {len(TP_BATCHES)}")
    TP_RESULT_RUNS = (TP_ALL_RUNS if _chosen is None
                      else list(dict.fromkeys(r for i, b in enumerate(TP_BATCHES, start=1) if i in _chosen for r in b)))
    TP_RESULT_TRAFFIC_RUNS = [r for r in TP_TRAFFIC_RUNS.values() if r in TP_RESULT_RUNS]
    if not TP_RESULT_TRAFFIC_RUNS:
        raise SystemExit(f"config error: study_tp.results_batches is {_chosen}: those batches hold no TP degree's "
                         f"bf16 run of seed {min(tp_seeds('bf16'))}, whose traffic the SQNR against TP reduces")

    # a batch: its runs, and the SQNR of each degree whose BF16 run of seed 0 it trains (measured in
    # the sitting that trains it: the captured traffic is not kept)
    for _i, _runs in enumerate(TP_BATCHES, start=1):

        rule:
            name:
                f"study_tp_batch{_i}"
            input:
                [f"{d}/summary.json" for d in _runs]
                + [f"{OUT}/bench/reduced_error_tp{tp}.csv" for tp, run in TP_TRAFFIC_RUNS.items() if run in _runs],

    rule study_tp_results:
        input:
            [f"{d}/summary.json" for d in TP_RESULT_RUNS],
        output:
            convergence=f"{TP_RESULTS}/tp_convergence.csv",
            summary=f"{TP_RESULTS}/tp_summary.csv",
            markdown=f"{TP_RESULTS}/tp_summary.md",
            figure=f"{OUT}/figures/loss_gap_tp.pdf",
        log:
            f"{OUT}/logs/study_tp_results.log",
        params:
            runs=TP_RESULT_RUNS,
            order=TRAIN["comms"],
            margin=STUDY_TP["margin"],
        shell:
            "{PY:q} -m fp4quant.analysis study-tp --profile {PROFILE:q} --runs {params.runs:q} --order {params.order:q}"
            " --margin {params.margin} --out-dir {TP_RESULTS:q} --figure {output.figure:q} --cores-per-run {TP_THREADS}"
            " 2> {log:q}"

    # the SQNR against TP, one degree as its BF16 run of seed 0 ends (its captured traffic, too big to
    # keep, goes with the sitting that trained it), then the degrees the results cover joined
    rule study_tp_reduced_error_degree:
        input:
            lambda wc: f"{TP_TRAFFIC_RUNS[int(wc.tp)]}/summary.json",
        output:
            csv=f"{OUT}/bench/reduced_error_tp{{tp}}.csv",
            summary=f"{OUT}/bench/reduced_error_tp{{tp}}_summary.csv",
        log:
            f"{OUT}/logs/study_tp_reduced_error_tp{{tp}}.log",
        wildcard_constraints:
            tp=r"\d+",
        params:
            captures=lambda wc: f"{TP_TRAFFIC_RUNS[int(wc.tp)]}/traffic",
            presets=",".join(c for c in TRAIN["comms"] if c != "exact"),
        threads: workflow.cores
        shell:
            "{PY:q} -m fp4quant.bench.reduced_error --captures {params.captures:q} --presets {params.presets:q}"
            " --max-calls {STUDY_TP[traffic_max_calls]} --out {output.csv:q} 2> {log:q}"

    rule study_tp_reduced_error:
        input:
            [f"{OUT}/bench/reduced_error_tp{tp}.csv" for tp, run in TP_TRAFFIC_RUNS.items()
             if run in TP_RESULT_TRAFFIC_RUNS],
        output:
            csv=f"{OUT}/bench/reduced_error.csv",
            summary=f"{OUT}/bench/reduced_error_summary.csv",
        log:
            f"{OUT}/logs/study_tp_reduced_error.log",
        shell:
            "{PY:q} -m fp4quant.bench.reduced_error --parts {input:q} --out {output.csv:q} 2> {log:q}"

    rule study_tp_sqnr_figure:
        input:
            rules.study_tp_reduced_error.output.summary,
        output:
            f"{OUT}/figures/sqnr_tp.pdf",
        log:
            f"{OUT}/logs/study_tp_sqnr_figure.log",
        shell:
            "{PY:q} -m fp4quant.analysis study-tp-sqnr --profile {PROFILE:q} --summary {input:q} --out {output:q}"
            " 2> {log:q}"

    rule study_tp:
        input:
            rules.study_tp_results.output,
            rules.study_tp_sqnr_figure.output,
