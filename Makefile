# `make demo` and `make test` do all the set-up on a fresh clone (both depend on `make install`).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
TRANSLATE := $(VENV)/bin/translate
# The demo: a tiny Transformer on Multi30k EN-DE, 15 minutes of training on a 2-core CPU, the
# length penalty chosen on the dev split, then the test split decoded and scored. The weights
# start as fairseq's (train.init=fairseq): scripts/bench_quality.py --recipe chose it at 15 minutes
# (dev BLEU 30.81 against 26.55 for tensor2tensor's init, on AVX2 in fp32; docs/results.md).
DEMO ?= config=tiny train.init=fairseq
DEMO_MINUTES ?= 15

.PHONY: install test test-slow demo bench clean

install: $(VENV)/.installed

# constraints.txt pins every tested version (torch==2.13.0: its CPU build, not a CUDA one); the
# transformers extra is for `translate export export.format=transformers`, the plot extra for `translate plot`.
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,transformers,plot]'
	touch $@

# Two workers (pytest-xdist), one per core: most tests wait on a subprocess starting up. A file's
# tests stay on one worker, so that its module fixtures are built once.
test: install
	$(PYTHON) -m pytest -q -n 2 --dist loadfile

test-slow: install
	$(PYTHON) -m pytest -q -m slow

demo: install
	$(TRANSLATE) train $(DEMO) train.max_minutes=$(DEMO_MINUTES)
	$(TRANSLATE) tune $(DEMO)
	$(TRANSLATE) decode $(DEMO)
	$(TRANSLATE) bleu $(DEMO)

bench: install
	$(PYTHON) scripts/bench_train.py

clean:
	rm -rf $(VENV) *.egg-info
