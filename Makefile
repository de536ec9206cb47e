# `make test` sets everything up from nothing (a .venv with the package and its test
# dependencies) and runs the tests; `make figures` does the same set-up, then the workflow.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The install (which builds the native extension) is redone only when a file it depends
# on changes: the dependency list, the bootstrap, the build script and its toolchain probes, or
# the C++/CUDA sources.
DEPS_FILES := pyproject.toml scripts/bootstrap.py setup.py fp4quant/toolchain.py $(sort $(shell find csrc -type f 2>/dev/null))
DEPS_HASH := $(shell cat $(DEPS_FILES) 2>/dev/null | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(DEPS_HASH)

.PHONY: test figures figures-clean paper setup clean

setup: $(STAMP)

$(STAMP): $(DEPS_FILES)
	$(PYTHON) scripts/bootstrap.py --venv $(VENV)
	rm -f $(VENV)/.installed-*
	touch $@

# The suite on TEST_WORKERS processes (pytest-xdist; 0: in this process), one test file to a
# worker at a time, so that a file's module fixtures are built once, in the order of collection
# (tests/conftest.py starts the longest files first).  At most 4 by default: many tests start 2-
# to 4-rank jobs of their own.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
test: $(STAMP)
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# Every figure and table of the paper from the default (CPU) configuration of the workflow,
# computed on this machine (committed reference results live under reference/, apart).
figures: $(STAMP)
	$(VENV)/bin/snakemake --cores all --configfile workflow/config/installed.yaml $(SNAKEMAKE_ARGS)

# The paper from the canonical frozen results (reference/ and data/), as docs/paper.pdf: the copy
# the README links (needs latexmk; `make figures` builds paper/build/main.pdf from your own run).
PAPER_SOURCES = --results reference/figures-zen4/data/cpu/results --study reference/study-convergence \
	--clusters data/projection_clusters.csv --topology data/allreduce_2x2_emulated.csv \
	--study-tp reference/study-tp/data/study_tp
paper: $(STAMP)
	rm -f paper/build-reference/main.pdf
	$(PY) -m fp4quant.analysis paper $(PAPER_SOURCES) --out-dir paper/build-reference
	@test -f paper/build-reference/main.pdf || { echo "make paper: no PDF was built (latexmk not installed?)" >&2; exit 1; }
	cp paper/build-reference/main.pdf docs/paper.pdf

# Remove what `make figures` produced (profile cpu; FIGURES_PROFILE=<profile> for another),
# checkpoints included, so that the next run computes everything afresh.
FIGURES_PROFILE ?= cpu
figures-clean:
	rm -rf data/$(FIGURES_PROFILE) figures/*.pdf paper/tables paper/main.pdf paper/build

clean:
	rm -rf $(VENV) build *.egg-info
