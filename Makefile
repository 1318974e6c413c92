# The README's two commands: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/quickstart.py

# Three test processes on the 2-core CI machine: the suite keeps the cores only ~75% busy
# with two (its tests wait on subprocesses, servers and deliberate holds), and a third fills
# that: the whole suite took 506 s with 3 against 716 s with 2 on one quiet machine.
test: $(STAMP)
	$(PY) -m pytest -n 3 --dist loadfile

lint: $(STAMP)
	$(VENV)/bin/ruff check alkstore_sa tests benchmarks examples
	$(VENV)/bin/mypy alkstore_sa

bench: $(STAMP)
	$(PY) -m benchmarks

# Sustained load on PostgreSQL (docs/performance.md, "Sustained load"): 10 minutes by
# default; `make bench-soak SOAK_ARGS=--quick` runs 1 minute (other options: --help).
.PHONY: bench-soak
bench-soak: $(STAMP)
	$(PY) -m benchmarks.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

# The two application examples, one command each: the app's own `alembic upgrade head`
# (alkstore included), two orders through the app, then the worker drains the queue.
# SQLite by default; ALKSTORE_DATABASE_URL=postgresql+psycopg://... for PostgreSQL (the two
# examples share one schema and migration chain, so they may share a database).
.PHONY: example-flask example-fastapi

example-flask: $(STAMP)
	$(PY) examples/flask_app/demo.py

example-fastapi: $(STAMP)
	$(PY) examples/fastapi_app/demo.py
