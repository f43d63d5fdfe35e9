# Baton: `make demo` shows turn-taking on this machine; `make test` runs lint, types and tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Extras besides dev, e.g. EXTRAS=torch (the real training tenants; CI sets it).
EXTRAS ?=
comma := ,
STAMP := $(VENV)/.installed$(if $(EXTRAS),-$(subst $(comma),-,$(EXTRAS)))

.PHONY: demo test lint soak proto bench clean
# The property and fuzz tests: fixed examples in `make test`, new ones each `make soak`.
PROPERTY_TESTS = $(filter-out tests/reliability/%,$(shell grep -rl --include='test_*.py' '^from hypothesis' tests))

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev$(if $(EXTRAS),$(comma)$(EXTRAS))]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/baton demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Two workers: the real-node tests (tests/k8s, mostly waiting on the node) in one, the rest in
# the other (tests/conftest.py groups them); then the tests marked `alone` (shares measured by
# the clock) in one process, with the machine to themselves. Their files go under a short
# /tmp/bt-*: the unix sockets tests make there must fit in 107 bytes. Kept after a failing run.
test: lint
	@tmp=$$(mktemp -d /tmp/bt-XXXXXX) && echo "make test: the tests' files under $$tmp" && \
	status=0 && $(BIN)/pytest -q -rs --durations=25 -n 2 --dist loadscope --no-loadscope-reorder --basetemp=$$tmp \
		-m 'not soak and not alone' || status=$$?; \
	$(BIN)/pytest -q -rs -m alone --basetemp=$$tmp/alone || status=$$?; \
	if [ $$status = 0 ]; then rm -rf $$tmp; fi; exit $$status

soak: $(STAMP)
	mkdir -p build && rm -f build/reliability.jsonl
	BATON_RELIABILITY_FIGURES=build/reliability.jsonl BATON_HYPOTHESIS_PROFILE=random \
		$(BIN)/pytest -q -rs -m 'soak or not soak' tests/reliability $(PROPERTY_TESTS)
	$(BIN)/python -m tests.reliability.report build/reliability.jsonl --out docs/reliability.md

proto: $(STAMP)
	PYTHON=$(BIN)/python bash hack/gen-proto.sh

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
