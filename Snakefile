# The fp4quant workflow: from source to the paper's tables and figures.
#
#   snakemake --cores all figures/throughput.pdf          # one figure (default CPU configuration)
#   snakemake --cores all                                 # every figure and table
#   snakemake --cores all ablation_no_fwht                # one ablation
#   snakemake --profile workflow/profiles/h100-slurm --configfile workflow/config/h100.yaml
#
# Configuration: workflow/config/default.yaml, validated against workflow/schemas/.
# Outputs: data/<profile>/... (raw logs and tidy CSVs), figures/*.pdf, paper/tables/*.tex.

import os
import sys

from snakemake.utils import min_version, validate

min_version("8.0")

BASE = workflow.basedir  # the repository: scripts and the package live here, outputs go to the working directory
PY = sys.executable  # the Python that runs Snakemake, with fp4quant installed

configfile: os.path.join(BASE, "workflow/config/default.yaml")
validate(config, os.path.join(BASE, "workflow/schemas/config.schema.yaml"))

include: "workflow/rules/common.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/benchmarks.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/cluster.smk"
include: "workflow/rules/results.smk"
include: "workflow/rules/paper.smk"


rule all:
    input:
        FIGURES,
        TABLES,
        PAPER_PDF,
