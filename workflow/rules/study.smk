# The convergence study (workflow/config/study.yaml): every run of train.comms x train.seeds,
# their results (data/<profile>/results/convergence.csv, convergence_summary.{csv,md}) and
# figures (data/<profile>/figures/convergence.pdf, tradeoff.pdf).
#   snakemake --cores all study --configfile workflow/config/study.yaml           # everything
#   snakemake --cores all study_batch1 --configfile workflow/config/study.yaml    # the first batch's runs

from fp4quant.analysis import STUDY_FIGURES

STUDY_BATCHES = config.get("study", {}).get("batches") or [TRAIN["comms"]]
STUDY_RESULTS = f"{OUT}/results"
STUDY_TABLES = f"{STUDY_RESULTS}/convergence_runs"  # the tables the convergence figure reads


def study_runs(comms):
    """The run folders of ``comms``: every compute and seed each trains with."""
    return [run_dir(variant(c, k), s) for c in comms for k in COMPUTES for s in seeds_of(c)]


for _i, _batch in enumerate(STUDY_BATCHES, start=1):

    rule:
        name:
            f"study_batch{_i}"
        input:
            [f"{d}/summary.json" for d in study_runs(_batch)],


rule study_results:
    input:
        [f"{d}/summary.json" for d in study_runs(TRAIN["comms"])],
    output:
        convergence=f"{STUDY_RESULTS}/convergence.csv",
        summary=f"{STUDY_RESULTS}/convergence_summary.csv",
        markdown=f"{STUDY_RESULTS}/convergence_summary.md",
        training=f"{STUDY_TABLES}/training.csv",
        curves=f"{STUDY_TABLES}/curves.csv",
    log:
        f"{OUT}/logs/study_results.log",
    params:
        runs=study_runs(TRAIN["comms"]),
        order=[variant(c, k) for c in TRAIN["comms"] for k in COMPUTES],
    shell:
        "{PY:q} -m fp4quant.analysis study --profile {PROFILE:q} --runs {params.runs:q} --order {params.order:q}"
        " --out-dir {STUDY_RESULTS:q} --tables-dir {STUDY_TABLES:q} 2> {log:q}"


rule study_figure:
    input:
        csvs=[rules.study_results.output.convergence, rules.study_results.output.summary,
              rules.study_results.output.training, rules.study_results.output.curves],
        # the trade-off's SQNR on the traffic of the study's model (bench.traffic_model)
        traffic=lambda wc: [rules.traffic_benchmark.output.summary] if wc.name == "tradeoff" else [],
    output:
        f"{OUT}/figures/{{name}}.pdf",
    wildcard_constraints:
        name="|".join(STUDY_FIGURES),
    log:
        f"{OUT}/logs/study_figure_{{name}}.log",
    params:
        results=lambda wc: STUDY_TABLES if wc.name == "convergence" else STUDY_RESULTS,
        traffic=lambda wc, input: q("--traffic", input.traffic[0]) if input.traffic else "",
    shell:
        "{PY:q} -m fp4quant.analysis figure {wildcards.name:q} --results {params.results:q} --profile {PROFILE:q}"
        " --out {output:q} --inputs {input.csvs:q} {params.traffic} 2> {log:q}"


rule study:
    input:
        rules.study_results.output,
        expand(f"{OUT}/figures/{{name}}.pdf", name=STUDY_FIGURES),
