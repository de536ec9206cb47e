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

.PHONY: test figures figures-clean setup clean

setup: $(STAMP)

$(STAMP): $(DEPS_FILES)
	$(PYTHON) scripts/bootstrap.py --venv $(VENV)
	rm -f $(VENV)/.installed-*
	touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# Every figure and table of the paper from the default (CPU) configuration of the workflow,
# computed on this machine (committed reference results live under reference/, apart).
figures: $(STAMP)
	$(VENV)/bin/snakemake --cores all --configfile workflow/config/installed.yaml $(SNAKEMAKE_ARGS)

# Remove what `make figures` produced (profile cpu; FIGURES_PROFILE=<profile> for another),
# checkpoints included, so that the next run computes everything afresh.
FIGURES_PROFILE ?= cpu
figures-clean:
	rm -rf data/$(FIGURES_PROFILE) figures/*.pdf paper/tables paper/main.pdf

clean:
	rm -rf $(VENV) build *.egg-info
