# Set-up and entry points. Both main targets create .venv themselves and are idempotent.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.lait-installed

.PHONY: demo test test-fast fuzz bench clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch and torchvision are pinned together in one command, or pip swaps torch.
	$(BIN)/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1 -e '.[dev]'
	# Stage 2's face detector (MTCNN, MIT, weights inside): its package pins an old torch, so it
	# comes without its dependencies, which lait's own already provide (docs/safety.md).
	$(BIN)/python -m pip install --quiet --no-deps facenet-pytorch==2.6.0
	touch $(STAMP)

## demo: run the whole pipeline offline on the built-in local web (shards + report in demo/)
demo: $(STAMP)
	$(BIN)/lait demo --out demo/

# The suite runs in one worker process per core (pytest-xdist); tests that share an expensive
# set-up or start Ray clusters run in groups, one group on one worker (tests/conftest.py,
# docs/testing.md). `--durations=15` prints the slowest tests of every run.
PARALLEL := -n auto --dist loadgroup --durations=15

## test: lint (ruff: import order, common bugs), then the whole test suite (what CI runs)
test: $(STAMP)
	bash scripts/system-deps.sh
	$(BIN)/ruff check .
	# The offline demo scorer, trained once per machine into ~/.cache/lait (about 90 s; nothing
	# when cached): the demo tests read it, and made inside the run it slowed the tests beside it.
	$(BIN)/lait score --build-demo-model
	$(BIN)/python -m pytest -q $(PARALLEL)

## test-fast: the suite without the tests marked slow
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow" $(PARALLEL)

## bench: every stage bench beside its peer, alternating rounds, one table (bench/all.py)
bench: $(STAMP)
	$(BIN)/python bench/all.py

## fuzz: the fuzz tests long and random (hypothesis), then coverage-guided (atheris, where it installs)
FUZZ_EXAMPLES ?= 2000
FUZZ_SECONDS ?= 120
fuzz: $(STAMP)
	LAIT_FUZZ_PROFILE=lait-fuzz LAIT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -q -m fuzz -p no:cacheprovider
	$(BIN)/python -m pip install --quiet 'atheris>=2.3' || echo "fuzz: atheris does not install here; hypothesis only"
	$(BIN)/python scripts/fuzz.py all --seconds $(FUZZ_SECONDS)

clean-venv:
	rm -rf $(VENV)
