# `make test` and `make demo` create .venv and install the pinned stack when needed.
# The install re-runs only when pyproject.toml changes (the stamp carries its hash).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=
# Two pytest workers, one a core. A third was measured no faster (11:46 against 12:11) and peaked at 9.1 GiB
# summed PSS, past the suite's 8 GiB budget (docs/testing.md).
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=15

.PHONY: install test test-fast demo benchmarks clean cluster-up cluster-down

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m tag_core.plan.warm_kernels
	@rm -f $(VENV)/.installed-*
	@touch $@

test: install
	$(PYTEST) $(PYTEST_ARGS)

test-fast: install
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

# The main job: demo models x examples/topologies, one Dagster run per partition, two at a time in two
# worker processes, with progress; then the plan table, the report and the command that opens the UI.
# DEMO_ARGS=--full plans the six benchmark models instead (slow on a CPU); DEMO_ARGS="--workers 1" one at a time.
DEMO_ARGS ?=
demo: install
	$(PY) -m tag_pipelines.demo $(DEMO_ARGS)

benchmarks: install
	$(PY) benchmarks/capture_profile.py

# Cluster mode on this machine (docs/dagster.md): PostgreSQL, Redis, the Dagster daemon and webserver and
# CLUSTER_WORKERS Celery workers, on loopback, data under .cluster/; then `source .cluster/env`.
# Needs Debian's postgresql and redis-server packages (apt-get install postgresql redis-server).
CLUSTER_WORKERS ?= 2
cluster-up: install
	$(PY) -m tag_pipelines.local_cluster up --workers $(CLUSTER_WORKERS)

cluster-down:
	$(PY) -m tag_pipelines.local_cluster down

clean:
	rm -rf $(VENV) .tag .pytest_cache
