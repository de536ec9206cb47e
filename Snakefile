# The fp4quant workflow: from source to the paper's tables and figures.
# `snakemake --cores all data/error.csv` regenerates the codec's error measurements.

rule error_benchmark:
    output:
        csv="data/error.csv",
        meta="data/error.csv.meta.json",
    log:
        "logs/error_benchmark.log",
    shell:
        "python -m fp4quant.bench.error --out {output.csv} 2> {log}"
