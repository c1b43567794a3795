# grokspectra — `make book` and `make test` work from a fresh clone; see README.md.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DELETE_ON_ERROR:
.PRECIOUS: build/params/%.yaml

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
PROFILE ?= ci
TIMEOUT ?= 3600
# Keep kernels and papermill away from kernelspecs elsewhere on this machine, and Jupyter's data in the tree.
export JUPYTER_DATA_DIR := $(CURDIR)/build/jupyter
export JUPYTER_PATH := $(CURDIR)/$(VENV)/share/jupyter
export PYDEVD_DISABLE_FILE_VALIDATION := 1

NOTEBOOKS := $(sort $(basename $(notdir $(wildcard notebooks/*.md))))
EXECUTED := $(NOTEBOOKS:%=book/generated/%.ipynb)
SRC := $(shell find src -name '*.py' 2>/dev/null) pyproject.toml

.PHONY: all book test paper run bench clean venv check-params
all: book

venv: $(STAMP)
$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (ipykernel)" >/dev/null
	touch $@

# Parameters of one notebook in the chosen profile; rewritten only when they change (so make stays incremental).
build/params/%.yaml: FORCE | $(STAMP)
	@mkdir -p $(@D)
	@$(PY) -m grokspectra params $(PROFILE) $* > $@.new
	@if cmp -s $@.new $@; then rm $@.new; else mv $@.new $@; fi
FORCE:

# Execute one notebook: MyST source -> ipynb -> papermill into a temporary file, renamed only on success.
book/generated/%.ipynb: notebooks/%.md build/params/%.yaml $(SRC) $(STAMP)
	@mkdir -p build/ipynb book/generated
	$(BIN)/jupytext --quiet --to ipynb --output build/ipynb/$*.ipynb $<
	@rm -f book/generated/.$*.partial.ipynb
	$(BIN)/papermill --no-progress-bar -k python3 --cwd notebooks --execution-timeout $(TIMEOUT) \
	  build/ipynb/$*.ipynb book/generated/.$*.partial.ipynb -f build/params/$*.yaml \
	  || { rm -f book/generated/.$*.partial.ipynb; echo "notebook $* FAILED (see the traceback above)"; exit 1; }
	$(PY) -m grokspectra.nbtools hide-injected book/generated/.$*.partial.ipynb
	mv book/generated/.$*.partial.ipynb $@

# The intro page reads the chapters' summary tables, so it runs after them.
book/generated/intro.ipynb: book/intro.md $(filter-out book/generated/intro.ipynb,$(EXECUTED)) $(SRC) $(STAMP)
	@mkdir -p build/ipynb book/generated
	$(BIN)/jupytext --quiet --to ipynb --output build/ipynb/intro.ipynb $<
	$(BIN)/papermill --no-progress-bar -k python3 --cwd book build/ipynb/intro.ipynb book/generated/.intro.partial.ipynb \
	  || { rm -f book/generated/.intro.partial.ipynb; exit 1; }
	mv book/generated/.intro.partial.ipynb $@

book: $(EXECUTED) book/generated/intro.ipynb
	$(BIN)/jupyter-book build . -W -n --keep-going
	@echo "book: $(CURDIR)/_build/html/index.html"

test: $(STAMP)
	$(BIN)/pytest

# Every experiment at the papers' scale into results/paper (meant for a GPU; works slowly on a CPU).
paper: $(STAMP)
	$(PY) -m grokspectra run all --profile paper

bench: $(STAMP)
	$(PY) -m grokspectra bench modadd

# One parameterised rerun: make run NB=ch6_repulsion [PROFILE=ci] P="-p seeds 3"
# Its outputs go to build/runs/<NB>-<id>/ (id: a hash of the resolved parameters, so concurrent reruns with other
# parameters never collide): <NB>.ipynb, params.yaml (the resolved parameters) and the claims summary <NB>.json
# (never build/summary, which the book's intro reads). `check` validates the parameters (and the device) first,
# exactly as papermill will read them. Everything is written under a private partial name and moved into place only on success; a previous
# output of the same parameters is removed first, so a failed rerun never leaves an older notebook as its result.
run: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make run NB=<notebook> [PROFILE=ci] [P=\"-p key value ...\"]"; exit 2; }
	@test -f notebooks/$(NB).md || { echo "no notebook notebooks/$(NB).md; notebooks: $(NOTEBOOKS)"; exit 2; }
	@mkdir -p build/runs; part=build/runs/.partial-$(NB)-$$$$; trap 'rm -rf $$part' EXIT; mkdir -p $$part/summary; \
	  id=$$($(PY) -m grokspectra check $(NB) --profile $(PROFILE) --id --write-params $$part/params.yaml $(P)) \
	    || exit 2; \
	  out=build/runs/$(NB)-$$id; mkdir -p $$out; rm -f $$out/$(NB).ipynb $$out/$(NB).json; \
	  $(BIN)/jupytext --quiet --to ipynb --output $$part/source.ipynb notebooks/$(NB).md; \
	  echo "executing $(NB) ($(PROFILE) profile) into $$out/"; \
	  GROKSPECTRA_SUMMARY_DIR=$(CURDIR)/$$part/summary $(BIN)/papermill --no-progress-bar -k python3 --cwd notebooks \
	    $$part/source.ipynb $$part/$(NB).ipynb -f $$part/params.yaml $(P) \
	    || { echo "notebook $(NB) FAILED (see the traceback above); nothing written to $$out/"; exit 1; }; \
	  mv $$part/params.yaml $$out/params.yaml; \
	  if test -f $$part/summary/$(NB).json; then mv $$part/summary/$(NB).json $$out/$(NB).json; fi; \
	  mv $$part/$(NB).ipynb $$out/$(NB).ipynb; \
	  echo "executed notebook: $$out/$(NB).ipynb"

clean:
	rm -rf _build build book/generated results/ci results/custom
