# Paths, the run list and the launcher command shared by the rules.
import shutil

PROFILE = config["profile"]
OUT = f"data/{PROFILE}"
TRAIN = config["train"]
MODEL = TRAIN["model"].rstrip("/").split("/")[-1]  # a preset, or the name of an HF folder
ABLATIONS = config.get("ablations", [])
RUN_COMMS = list(dict.fromkeys(TRAIN["comms"] + ABLATIONS))  # ablations train too
QUICK = config["bench"].get("quick", False)

# Training runs on the emulated multi-node cluster (falling back to loopback where it cannot
# be built) unless cluster.enabled is false (e.g. on a real cluster).
CLUSTER = config.get("cluster", {})
EMULATED = CLUSTER.get("enabled", False)
NODES = CLUSTER.get("nodes", 2)

FIGURE_NAMES = ["throughput", "kernels", "allreduce", "convergence", "error"] + (["projection"] if EMULATED else [])
TABLE_NAMES = ["formats", "ablation", "end_to_end"]
FIGURES = expand("figures/{name}.pdf", name=FIGURE_NAMES)
TABLES = expand("paper/tables/{name}.tex", name=TABLE_NAMES)
HAVE_LATEXMK = shutil.which("latexmk") is not None
PAPER_PDF = ["paper/main.pdf"] if HAVE_LATEXMK else []
if not HAVE_LATEXMK:
    print("fp4quant workflow: latexmk not found, so paper/main.pdf is not built "
          "(paper/main.tex includes the generated tables and figures)", file=sys.stderr)


def run_dir(comm, seed):
    """The folder of the training run of one TP communication preset and seed."""
    return f"{OUT}/{'cluster/' if EMULATED else ''}runs/{MODEL}/{comm}/seed{seed}"


RUN_DIRS = [run_dir(c, s) for c in RUN_COMMS for s in TRAIN["seeds"]]


def launcher(nproc=None):
    """The command that starts a distributed job with the configured launcher."""
    L = config["launcher"]
    cmd = (f"{PY} {BASE}/workflow/scripts/launch.py --kind {L['kind']} "
           f"--nproc-per-node {nproc or L['nproc_per_node']} --nnodes {L.get('nnodes', 1)} --port {L.get('port', 29500)}")
    if L.get("nodes"):
        cmd += " --nodes " + " ".join(L["nodes"])
    return cmd + " --"
