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

# The suite in two passes, both always run (the target fails if either did). The single-process tests
# (`-m "not slow"`: 1,440 of them, ~1,000 s on one core of the 2-core CI machine) on both cores at once, a test file
# per pytest-xdist worker (566 s, 2026-12-02); then the multi-process runs (`-m slow`: 2-8 ranks each, DeepSpeed
# and SLURM jobs, which already fill both cores and hold timing and memory checks), one at a time.
test: setup
	@rc=0; $(VENV)/bin/pytest -m "not slow" -n 2 --dist loadfile || rc=$$?; \
	$(VENV)/bin/pytest -m slow || rc=$$?; exit $$rc
