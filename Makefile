# The two commands of the README: `make demo` and `make test`.
# Both create .venv on first use and install what they need: the demo only
# the runtime and the testproject's settings (the `demo` group, well under a
# minute), the suite the development groups (GROUPS, `dev` by default).

VENV    := .venv
PY      := $(VENV)/bin/python
GROUPS  ?= dev
empty   :=
space   := $(empty) $(empty)
STAMP   := $(VENV)/.installed-$(subst $(space),-,$(GROUPS))
PYTEST_ARGS ?=

.PHONY: demo demo-venv test test-all lint fmt serve bench venv clean docs faults faults-quick

venv: $(STAMP)

# One stamp per set of groups: installing the demo's does not count as
# installing the suite's, so `make test` after `make demo` installs dev.
$(VENV)/.installed-%: pyproject.toml scripts/find_python.sh
	@test -x $(PY) || "$$(scripts/find_python.sh)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=25.1"
	$(PY) -m pip install --quiet -e . $(foreach g,$(subst -,$(space),$*),--group $(g))
	@touch $@

demo-venv: $(VENV)/.installed-demo

demo: demo-venv
	$(PY) manage.py migrate --noinput --verbosity 0
	$(PY) manage.py demo

# The suite on both cores (pytest-xdist; each worker has its own test
# database), without the tests marked slow; `make test-all` and CI run
# everything: PYTEST_SELECT= (empty) selects all, PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2
PYTEST_SELECT  ?= -m "not slow"
test: venv
	$(PY) -m pytest -n $(PYTEST_WORKERS) $(PYTEST_SELECT) $(PYTEST_ARGS)

test-all:
	$(MAKE) test PYTEST_SELECT=

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy kumiflow_django testproject tests
	$(VENV)/bin/lint-imports
	DATABASE_URL=sqlite:///:memory: $(PY) manage.py makemigrations --check --dry-run
	DATABASE_URL=sqlite:///:memory: $(PY) manage.py check --fail-level WARNING

docs: venv
	$(PY) -m pip install --quiet --group docs
	$(VENV)/bin/mkdocs build --strict --site-dir build/site

fmt: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The development server, styled: DEBUG=true makes runserver serve the
# admin's static files (the testproject's DEBUG is off unless asked for).
# A worker runs beside it; both restart when the code changes. Ctrl-C reaches
# both: the shell waits for the worker to finish the work at hand.
SERVE_ADDR ?= 127.0.0.1:8000
serve: demo-venv
	$(PY) manage.py migrate --noinput --verbosity 0
	$(PY) manage.py demo --superuser-only
	@$(PY) manage.py kumiflow_worker --reload & worker=$$!; \
	trap 'wait $$worker' INT; \
	DEBUG=true $(PY) manage.py runserver $(SERVE_ADDR); status=$$?; \
	kill -TERM $$worker 2>/dev/null; wait $$worker; exit $$status

# BENCH_ARGS="--peer dbos" adds DBOS Transact (installed into .venv on demand).
BENCH_ARGS ?=
bench: venv
	$(PY) -m pip install --quiet --group postgres --group mysql --group test $(if $(findstring dbos,$(BENCH_ARGS)),--group bench,)
	$(PY) bench/run.py $(BENCH_ARGS)

# The fault suite (bench/faults, docs/reliability.md): worker hosts in network
# namespaces of its own, cut off or paused mid-work, and a Patroni failover.
# Needs root (ip netns); installs Debian's patroni and etcd when missing.
FAULTS_ARGS ?=
faults: venv
	$(PY) -m pip install --quiet --group postgres --group test
	$(PY) -m bench.faults --repeat 3 --failover $(FAULTS_ARGS)

# One partition and one failover (a minute or two).
faults-quick: venv
	$(PY) -m pip install --quiet --group postgres --group test
	$(PY) -m bench.faults --quick

clean:
	rm -rf $(VENV) build dist *.egg-info testproject/db.sqlite3*
