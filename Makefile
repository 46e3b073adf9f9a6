PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOG_DIR ?= logs/demo

.PHONY: demo view test lint install clean browser rust debian reach

EXAMPLE := examples/example-env

$(STAMP): pyproject.toml $(EXAMPLE)/pyproject.toml scripts/install.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip uv || $(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python scripts/install.py -e ".[dev]" -e $(EXAMPLE)
	$(BIN)/python -c "from openrebench.harness._offline import install_from_litellm_wheel; install_from_litellm_wheel()"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP) rust debian reach
	@began=$$(date +%s); set -x; \
	$(BIN)/openrebench eval all --tier mini --agent oracle --log-dir logs/demo --runs-dir runs/demo && \
	$(BIN)/openrebench eval optimize_kernel --tier mini --agent react --model local --time-limit 1m \
		--log-dir logs/demo --runs-dir runs/demo; code=$$?; set +x; \
	echo "demo: $$(( ($$(date +%s) - began) / 60 )) min $$(( ($$(date +%s) - began) % 60 )) s in all"; exit $$code

# Inspect's log viewer on the demo's logs (or LOG_DIR=...), without activating the virtual environment
view: $(STAMP)
	$(BIN)/inspect view --log-dir $(LOG_DIR)

# The suite in two passes: everything but the timing tests on TEST_WORKERS processes, then the timing
# tests alone, so that no other test's load moves what they measure.
TEST_WORKERS ?= 2

test: $(STAMP) browser rust debian reach
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not timing"
	$(BIN)/python -m pytest -m timing

# The report test renders the HTML page in headless Chromium; install it where we may (root + apt).
browser:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium >/dev/null) || echo "note: could not install chromium; the report render test will be skipped"; \
	else echo "note: chromium not installed (needs root and apt-get); the report render test will be skipped"; fi

# rust_codecontests compiles the programs it scores with the system's rustc; install Debian's where we may.
rust:
	@if command -v rustc >/dev/null 2>&1 || [ -n "$$RUSTC" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			rustc >/dev/null) || echo "note: could not install rustc; rust_codecontests will not run"; \
	else echo "note: rustc not found (install Rust: apt-get install rustc, or rustup); rust_codecontests will not run"; fi

# chat_rl's mini tier reads Debian's dictionary (dict-gcide, fetched with apt-get download, nothing
# installed): make sure apt's package lists know it.
debian:
	@if command -v apt-get >/dev/null 2>&1 && ! apt-cache show dict-gcide >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq || echo "note: apt-get update failed; chat_rl's mini tier needs dict-gcide"; \
		else echo "note: apt does not know dict-gcide (run apt-get update as root); chat_rl's mini tier needs it"; fi; fi

# The sandboxes drop to unprivileged uids of their own, which must be able to reach this checkout (its Python and package):
# under a private home (root's /root is mode 700) the human agent's login fails. Say so up front.
reach:
	@d="$(CURDIR)"; while [ "$$d" != / ]; do \
		if [ -z "$$(find "$$d" -maxdepth 0 -perm -o+x)" ]; then \
			echo "note: $$d (mode $$(stat -c %a "$$d")) is closed to other users, so the sandboxes' unprivileged uids cannot reach this checkout: the human agent's login and a scorer test will fail; clone elsewhere (e.g. under /srv) or chmod o+x $$d"; break; fi; \
		d=$$(dirname "$$d"); done

# ruff check only: the code keeps its compact hand layout (ruff format would expand it by about 2,800 lines)
lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build src/*.egg-info
