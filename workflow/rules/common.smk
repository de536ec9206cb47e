# Paths, the run list, the launcher command and the provenance key shared by the rules.
#
# Quoting: a value that reaches a shell (from the configuration, or a path) is quoted where it
# is spliced, so that it arrives as one word and never as shell syntax: `{x:q}` in a rule's
# shell string (Snakemake's shlex.quote, each item of a list), `q(...)` in a command fragment
# built here in Python (a param spliced into the shell string as it is).
import json
import os
import shlex
import shutil

import torch
from fp4quant.analysis.collect import identical_bytes
from fp4quant.provenance import code_digest, git_commit, hardware
from fp4quant.train.train_config import parse_run_name, run_name

PROFILE = config["profile"]
OUT = f"data/{PROFILE}"
TRAIN = config["train"]
MODEL = TRAIN["model"].rstrip("/").split("/")[-1]  # a preset, or the name of an HF folder
ABLATIONS = config.get("ablations", [])
# an ablation that sends fp4quant's bytes (naive_pack: only how kernels store them differs) is a
# kernel ablation: its training would repeat fp4quant's bit for bit, so it trains nothing
KERNEL_ABLATIONS = [a for a in ABLATIONS if identical_bytes(a)]
TRAINED_ABLATIONS = [a for a in ABLATIONS if a not in KERNEL_ABLATIONS]
RUN_COMMS = list(dict.fromkeys(TRAIN["comms"] + TRAINED_ABLATIONS))  # ablations train too
QUICK = config["bench"].get("quick", False)

# The training runs (convergence, ablations) run with the launcher: their wall time is no
# result.  Throughput comes from short dedicated runs (cluster.throughput) on the emulated
# multi-node cluster, every component dilated (falling back to loopback where it cannot be
# built), unless cluster.enabled is false (e.g. on a real cluster: there the training runs'
# own tokens/s are the throughput).
CLUSTER = config.get("cluster", {})
EMULATED = CLUSTER.get("enabled", False)
NODES = CLUSTER.get("nodes", 2)
THROUGHPUT = CLUSTER.get("throughput", {})

FIGURE_NAMES = ["throughput", "kernels", "allreduce", "convergence", "error", "sensitivity", "breakdown", "topology"] + (
    ["projection", "validation"] if EMULATED else [])
TABLE_NAMES = ["formats", "ablation", "end_to_end"] + (["model_validation", "regime"] if EMULATED else [])
FIGURES = expand("figures/{name}.pdf", name=FIGURE_NAMES) + ["figures/traffic.pdf"]  # traffic: its own rule
TABLES = expand("paper/tables/{name}.tex", name=TABLE_NAMES)
HAVE_LATEXMK = shutil.which("latexmk") is not None
# built where its source is: a run from another folder (--snakefile) makes the figures and tables only
PAPER_PDF = ["paper/build/main.pdf"] if HAVE_LATEXMK and os.path.exists("paper/main.tex") else []
if not HAVE_LATEXMK:
    print("fp4quant workflow: latexmk not found, so paper/build/main.pdf is not built (paper/main.tex includes "
          "the generated tables and figures; on Debian: apt-get install latexmk texlive-latex-base "
          "texlive-latex-recommended)", file=sys.stderr)


# What every result depends on beyond its rule's inputs: the code's commit, torch and, where the
# jobs run on this machine, its hardware.  It is a parameter of the rules at the root of the
# graph (build_extension, prepare_data), so when it changes -- a new commit, say -- Snakemake
# reruns them and everything after them ("Params have changed"), and no figure set ever puts
# results of two commits or machines side by side (the analysis steps also check it).
PROVENANCE_KEY = f"{git_commit()}, torch {torch.__version__}" + (
    f", {hardware()}" if config["launcher"]["kind"] == "torchrun" else "")  # elsewhere jobs run on other hosts
# A profile of training runs that take longer than a sitting (`provenance: training_code`: the TP
# study) keys them on the training code instead (fp4quant.provenance.code_digest): its runs gather
# over commits that leave that code as it was, and over machines (each run's summary names its
# commit and hardware, and the study's analysis checks that every run has one code and torch).
# Its timings are no result.
if config.get("provenance", "commit") == "training_code":
    TRAINING_CODE = code_digest()
    if TRAINING_CODE == "unknown":  # every tree would share this key: runs of other code kept as this code's
        raise SystemExit("config error: provenance: training_code keys the runs on the training code's digest, and "
                         "git cannot read this tree (not a git checkout?); set FP4QUANT_CODE to name the code, or "
                         "use provenance: commit")
    ROOT_KEY = f"training code {TRAINING_CODE}, torch {torch.__version__}"
else:
    ROOT_KEY = PROVENANCE_KEY


def q(*words):
    """A command line's words, each shell-quoted (a list or tuple gives one word per item)."""
    flat = []
    for word in words:
        flat.extend(word if isinstance(word, (list, tuple)) else [word])
    return " ".join(shlex.quote(str(word)) for word in flat)


def run_dir(comm, seed):
    """The folder of the training run of one TP communication preset and seed."""
    return f"{OUT}/runs/{MODEL}/{comm}/seed{seed}"


def throughput_dir(comm, seed):
    """The folder of a throughput run on the emulated cluster (one repeat per seed)."""
    return f"{OUT}/cluster/throughput/{MODEL}/{comm}/seed{seed}"


def throughput_args(wildcards):
    """A throughput run's trainer flags: the training runs' options at the throughput shape and
    steps, no checkpoint before the last step and no evaluation (their time is no result)."""
    shape = {k: THROUGHPUT[k] for k in ("steps", "seq_len", "batch_size")}
    return train_args(wildcards, {**TRAIN, **shape, "checkpoint_every": THROUGHPUT["steps"], "eval_batches": 0})


THROUGHPUT_DIRS = [throughput_dir(c, s) for c in THROUGHPUT.get("comms", []) for s in THROUGHPUT.get("seeds", [])]


ABLATION_SEEDS = TRAIN.get("ablation_seeds", TRAIN["seeds"])


def seeds_of(comm):
    """The seeds a TP communication trains with: every seed for the compared presets, the
    ablation seeds for an ablation that is not also one of them."""
    return TRAIN["seeds"] if comm in TRAIN["comms"] else ABLATION_SEEDS


# The compute of the linear layers (fp4quant.train --compute): a run of compute other than
# exact lives in a folder named "<comm>+<compute>" (the ablations run with exact compute).  A
# comm may name its directions, "<preset>@fwd" (fp4quant.train.train_config.run_name).
COMPUTES = TRAIN.get("computes", ["exact"])


def variant(comm, compute):
    preset, compress, _ = parse_run_name(comm)
    return run_name(preset, compress, compute)


RUN_VARIANTS = [variant(c, k) for c in RUN_COMMS for k in (COMPUTES if c in TRAIN["comms"] else ["exact"])]
RUN_DIRS = [run_dir(v, s) for v in RUN_VARIANTS for s in seeds_of(v.partition("+")[0])]


def fresh_run(wildcards, args, inputs, folder=run_dir):
    """The command that empties a run folder (``folder(comm, seed)``) unless it holds a run of exactly
    this job (same provenance key, arguments and input files), which the trainer then resumes after an interruption."""
    key = json.dumps({"provenance": ROOT_KEY, "args": args})
    return q(PY, f"{BASE}/workflow/scripts/fresh_run.py", folder(wildcards.comm, wildcards.seed), key, list(inputs))


def launcher(nproc=None):
    """The command that starts a distributed job with the configured launcher."""
    L = config["launcher"]
    cmd = q(PY, f"{BASE}/workflow/scripts/launch.py", "--kind", L["kind"], "--nproc-per-node",
            nproc or L["nproc_per_node"], "--nnodes", L.get("nnodes", 1), "--port", L.get("port", 29500))
    if L.get("nodes"):
        cmd += " " + q("--nodes", L["nodes"])
    return cmd + " --"
