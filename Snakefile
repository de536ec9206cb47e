# The fp4quant workflow: from source to the paper's tables and figures.
#
#   snakemake --cores all figures/throughput.pdf          # one figure (default CPU configuration)
#   snakemake --cores all                                 # every figure and table
#   snakemake --cores all ablation_no_fwht                # one ablation (ablation_naive_pack: kernels only)
#   snakemake --cores all topology_emulated               # the topology model on 2 emulated nodes x 2 ranks
#   snakemake --profile workflow/profiles/h100-slurm --configfile workflow/config/h100.yaml
#
# Configuration: workflow/config/default.yaml, checked against workflow/schemas/ and the code
# (workflow/scripts/config_check.py: a mistake is one line naming the key).
# Outputs: data/<profile>/... (raw logs and tidy CSVs), figures/*.pdf, paper/tables/*.tex.

import importlib.util
import os
import sys

import yaml
from snakemake.utils import min_version, validate

min_version("8.0")

BASE = workflow.basedir  # the repository: scripts and the package live here, outputs go to the working directory
PY = sys.executable  # the Python that runs Snakemake, with fp4quant installed

configfile: os.path.join(BASE, "workflow/config/default.yaml")


def load_script(name):
    """A module of workflow/scripts/ (they are not part of the package)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(BASE, "workflow/scripts", f"{name}.py"))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


SCHEMA = os.path.join(BASE, "workflow/schemas/config.schema.yaml")
config_check = load_script("config_check")
try:  # one line naming the key, not Snakemake's dump of the schema
    config_check.check(config, yaml.safe_load(open(SCHEMA)))
except config_check.ConfigError as exc:
    raise SystemExit(f"config error: {exc}")
validate(config, SCHEMA)  # fills in the schema's defaults

include: "workflow/rules/common.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/benchmarks.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/traffic.smk"
include: "workflow/rules/cluster.smk"
include: "workflow/rules/topology.smk"
include: "workflow/rules/validation.smk"
include: "workflow/rules/throughput.smk"
include: "workflow/rules/results.smk"
include: "workflow/rules/paper.smk"
include: "workflow/rules/study.smk"
include: "workflow/rules/study_tp.smk"


rule all:
    input:
        FIGURES,
        TABLES,
        PAPER_PDF,
        [f"{OUT}/results/allreduce_prediction.csv"] if EMULATED else [],
        # each ablation's own CSV (seconds: its runs and benchmarks are the figures' too)
        expand(f"{OUT}/results/ablation_{{name}}.csv", name=ABLATIONS),
