# Everything a person does with mnemoflow is a target here. `make test` on a fresh machine
# creates the venv, lints, then runs the tests (which start and stop their own servers).

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
# Reinstall only when the dependencies change; the stamp lives inside the venv so that
# deleting the venv also forgets it.
STAMP  := $(VENV)/.installed-stamp
TYPED  := mnemoflow

.PHONY: venv lint test browser demo dev bench fmt docs clean distclean deploy-check requirements

venv: $(STAMP)

# The runtime closure is installed at the versions deploy/requirements.txt pins (the image's,
# which the tests run against), so a release on PyPI cannot change what a fresh clone tests;
# only the dev and embedded extras float.
$(STAMP): pyproject.toml deploy/requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	sed -n 's/^\([A-Za-z0-9][A-Za-z0-9._-]*==[^ \\]*\).*/\1/p' deploy/requirements.txt > $(VENV)/pins.txt
	$(BIN)/python -m pip install -c $(VENV)/pins.txt -e '.[dev,embedded]'
	touch $(STAMP)

# Check only: nothing is reformatted before it has been checked (use `make fmt` for that).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(TYPED)

test: lint browser
	$(BIN)/pytest

# The Temporal UI test drives Debian's headless chromium: install it when this machine can
# (root with apt); otherwise that one test is skipped and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
		|| echo "chromium unavailable: the Temporal UI test will be skipped"

demo: venv
	$(BIN)/mnemoflow demo

dev: venv
	$(BIN)/mnemoflow dev

# A benchmark is a script that prints its figures and writes them to benchmarks/results/; the
# protocol (benchmarks/_protocol.py) runs each 3 times on fresh stacks and writes the median with
# the spread and what else ran on the machine. Short sizes by default, `make bench FULL=1` for
# the full runs; plots go to docs/img/, then `make docs` puts the figures in the docs.
BENCHES    := hot_path throughput throughput_split round_floor retrieval retrieval_scale milvus_flush recall
BENCH_MODE := $(if $(FULL),,--short)
# The full throughput run adds one user's 200 rounds (history growth, docs/PERFORMANCE.md).
BENCH_ARGS_throughput := $(if $(FULL),-- --one-user 200,)
BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: venv $(BENCH_STAMP)
	@set -e; for name in $(BENCHES); do \
		echo "== benchmarks/_protocol.py $$name $(BENCH_MODE)"; \
		$(BIN)/python benchmarks/_protocol.py $$name $(BENCH_MODE) \
			$$( [ "$$name" = throughput ] && echo "$(BENCH_ARGS_throughput)" ); \
	done
	$(BIN)/python benchmarks/plots.py

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Regenerate the README configuration table from worker/settings.py, and every benchmark figure
# of README.md and docs/ from benchmarks/results/ (benchmarks/docfigs.py).
docs: venv
	$(BIN)/python -m mnemoflow.worker.settings_doc --write README.md
	$(BIN)/python benchmarks/docfigs.py --write

# Render the Helm chart for default, dev and prod and validate every manifest strictly for
# Kubernetes 1.29-1.32 (offline); lint the Dockerfile; check the image's pins match the venv.
deploy-check: venv
	$(BIN)/python -m deploy.manifests
	$(BIN)/hadolint deploy/Dockerfile
	$(BIN)/python -m deploy.requirements --check

# Re-pin the image's dependencies (versions from this venv, sha256 of every file from PyPI).
requirements: venv
	$(BIN)/python -m deploy.requirements

# Leaves .venv and the dev stack's data dir (.run) alone; `distclean` removes both.
clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info demo-output
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) .run
