# Two commands set up everything on a fresh machine:
#   make test    create .venv, install the package and test tools, install
#                Debian's mosquitto if missing (and apt is usable), run all tests
#   make bench   run the benchmarks and regenerate the figures in docs/
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# numba's on-disk cache must be writable (numba #4908); keep it out of the source tree.
export NUMBA_CACHE_DIR ?= $(CURDIR)/$(VENV)/numba-cache

.PHONY: test bench venv system-deps clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

system-deps:
	@scripts/install-system-deps.sh

test: $(STAMP) system-deps
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) -m benchmarks.bench_mechanisms --markdown docs/bench_mechanisms.md
	$(PY) -m benchmarks.plot_errors --out docs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
