# The two commands of the README:
#   make demo   set up .venv and run the main job
#   make test   set up .venv and run the whole test suite (what CI runs)
VENV ?= .venv
PIP := PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(VENV)/bin/pip --disable-pip-version-check

.PHONY: setup demo test
setup: $(VENV)/.installed

# torch first, pinned to the CPU wheel on disk (constraints.txt), so nothing later pulls a CUDA build.
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $@

demo: setup
	$(VENV)/bin/launcher train recipe=tiny

test: setup
	$(VENV)/bin/pytest
