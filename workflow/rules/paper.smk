# Figures (seaborn) and LaTeX tables from the tidy CSVs; the paper PDF where latexmk exists.  Each
# refuses inputs of two machines, commits or torch versions (fp4quant.analysis.origin) and
# stamps its own provenance (PDF metadata, a comment line of the table) for `freeze`.

RESULTS = f"{OUT}/results"


rule figure:
    input:
        rules.collect_results.output,
        rules.collect_throughput.output,
        rules.projection_sensitivity.output,
        rules.projection_clusters.output,
        [f"{OUT}/results/projection.csv", f"{OUT}/results/model_validation.csv"] if EMULATED else [],
    output:
        "figures/{name}.pdf",
    wildcard_constraints:
        name="|".join(FIGURE_NAMES),
    log:
        f"{OUT}/logs/figure_{{name}}.log",
    shell:
        "{PY:q} -m fp4quant.analysis figure {wildcards.name:q} --results {RESULTS:q} --profile {PROFILE:q}"
        " --out {output:q} --inputs {input:q} 2> {log:q}"


rule table:
    input:
        rules.collect_results.output,
        [f"{OUT}/results/model_validation.csv"] if EMULATED else [],
        rules.collect_throughput.output,
        rules.regime.output if EMULATED else [],
    output:
        "paper/tables/{name}.tex",
    wildcard_constraints:
        name="|".join(TABLE_NAMES),
    log:
        f"{OUT}/logs/table_{{name}}.log",
    shell:
        "{PY:q} -m fp4quant.analysis table {wildcards.name:q} --results {RESULTS:q} --profile {PROFILE:q}"
        " --out {output:q} --inputs {input:q} 2> {log:q}"


rule paper_pdf:
    """The paper (paper/main.tex) from this run's results: fp4quant.analysis.paper re-draws the
    figures and writes its tables and numbers beside a copy of main.tex under paper/build/."""
    input:
        FIGURES,
        TABLES,
        tex="paper/main.tex",
    output:
        "paper/build/main.pdf",
    log:
        f"{OUT}/logs/paper_pdf.log",
    shell:
        "{PY:q} -m fp4quant.analysis paper --results {RESULTS:q} --out-dir paper/build 2> {log:q}"
