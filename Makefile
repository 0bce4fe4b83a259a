# The two commands (see README):
#   make demo   set everything up, then run Shuttle's main job on a local cluster
#   make test   set everything up with test tools, then lint, type-check and test
.PHONY: demo test test-powerloss test-faults sanitize mutate mutate-sample sim-validate setup setup-dev lint lock clean compiled

demo: setup
	.venv/bin/shuttle demo

# Two workers: the suite mostly waits on node processes (13 min on one, 7 on two).
# Then a short sample of mutation testing (docs/testing.md; 10-30 s).
test: setup-dev lint
	.venv/bin/python -m pytest -q -n 2
	$(MUTATE_SAMPLE)

# Power-loss tier (needs root and FUSE): a node on LazyFS, POINTS power cuts, checks.
# LAZYFS is a built LazyFS directory or its build script (built once into ~/.cache/shuttle).
# Without LAZYFS: $$SHUTTLE_LAZYFS, else ../shared/vendor/build-lazyfs.sh beside this
# checkout or the repository it was cloned from, else a LazyFS already built.
LAZYFS ?=
POINTS ?= 1000
test-powerloss: setup-dev
	.venv/bin/python -m tests.powerloss $(if $(LAZYFS),--lazyfs $(LAZYFS)) --points $(POINTS) $(POWERLOSS_ARGS)

# The native code under AddressSanitizer and UBSan (docs/testing.md, "The sanitizer
# tier"): a copy of src/ built instrumented in build/sanitize/, its C extensions' tests
# (examples x SCALE, default 10), hostile read-lane frames to node processes, the
# librados completions on Ceph (NO_CEPH=1 skips), a short netrand. 10-15 min, so not
# part of `make test`.
sanitize: setup-dev
	scripts/sanitize.sh

# Mutation testing (docs/testing.md): each named module, one after the other, against
# its own tests (tests/mutation/modules.toml), as pure Python, niced for a shared machine.
# Minutes per module, so not part of `make test`. Reports: results/mutation/<module>.md
# and .json. SURVIVORS=1 re-tests only the last run's survivors; JOBS=2 runs two mutants
# at once; MUTATE_ARGS passes more (--sample N, --at REV, --min-score 0.9).
MODULES ?=
JOBS ?= 1
mutate: setup-dev
	@test -n "$(MODULES)" || { echo 'usage: make mutate MODULES="src/shuttle/store/journal.py ..."' >&2; exit 2; }
	nice -n 10 .venv/bin/python scripts/mutate.py --jobs $(JOBS) $(if $(SURVIVORS),--survivors) $(MUTATE_ARGS) -- $(MODULES)

# The short sample `make test` runs (10-30 s): 30 seeded mutants of the directory
# blocks, each caught or accepted as equivalent, so the tool and its lists keep working.
MUTATE_SAMPLE = nice -n 10 .venv/bin/python scripts/mutate.py --sample 30 --min-score 1 -- src/shuttle/objects/fs/dirblocks.py
mutate-sample: setup-dev
	$(MUTATE_SAMPLE)

# The simulator against live runs (issue 24; benchmarks/README.md, "The simulator
# against the live system"): 12 rows, links loopback, san, lan, wan by node speeds 1,
# 0.5, 0.25, each `shuttle sim predict --live` (each placement run until its median
# holds still, 5 to 15 runs; a drain at the node after each server run). 30-50 min on
# the shared 2-core machine, so not part of `make test` (which runs one small row).
# SIM_VALIDATE_ARGS passes more (--runs 3, --runs-max 5, --quiet-wait 0, --links lan
# --speeds 1).
sim-validate: setup-dev
	mkdir -p benchmarks/results
	.venv/bin/shuttle bench sim-predict --json-out benchmarks/results/sim-predict.json \
		--markdown benchmarks/results/sim-predict.md $(SIM_VALIDATE_ARGS)

# Fault tier (needs root: network namespaces): four nodes, POINTS faults, each at a
# step of the migration protocol in turn (kill -9 or a cut-off source, target or home);
# writes its figures to FAULTS_JSON.
FAULTS_JSON ?= benchmarks/results/faults.json
test-faults: setup-dev
	.venv/bin/python -m tests.faults --points $(POINTS) --json $(FAULTS_JSON) $(FAULTS_ARGS)

setup:
	scripts/setup.sh

setup-dev:
	scripts/setup.sh --dev

lint:
	.venv/bin/ruff check src tests benchmarks
	.venv/bin/ruff format --check src tests benchmarks
	.venv/bin/mypy

# Re-pin the dependencies after changing pyproject.toml (needs uv: pip install uv).
lock:
	uv pip compile pyproject.toml --extra build --generate-hashes --python-version 3.11 -q -o requirements.lock
	uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 -q -o requirements-dev.lock

# Rebuild the compiled hot modules (setup builds them when their sources change;
# SHUTTLE_PURE=1 runs the pure Python ones; see docs/architecture.md).
compiled:
	.venv/bin/python scripts/build_compiled.py --force

clean:
	-.venv/bin/python scripts/build_compiled.py --clean
	rm -rf .venv .pytest_cache .mypy_cache .ruff_cache build/mutate build/sanitize
