# Every target creates or refreshes the venv it needs; nothing else is assumed on the machine.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow lint bench bench-rebalance venv clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)  ## the main job: the whole pattern end to end on the embedded broker
	$(BIN)/lbg demo $(ARGS)

# RabbitMQ for the tests: Debian's package; the tests start a private node, never the service.
RABBITMQ_SERVER := /usr/lib/rabbitmq/bin/rabbitmq-server
$(RABBITMQ_SERVER):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server

test: $(STAMP) $(RABBITMQ_SERVER)  ## lint, then every test that the default run includes
	$(BIN)/ruff check services tests bench
	$(BIN)/python -m pytest $(ARGS)

test-slow: $(STAMP)  ## long soak and scale tests only
	$(BIN)/python -m pytest -m slow $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check services tests bench
	$(BIN)/ruff format --check services tests bench

bench: $(STAMP)  ## end-to-end throughput: sticky vs competing consumers
	$(BIN)/python bench/throughput.py $(ARGS)

bench-rebalance: $(STAMP)  ## join, crash and planned-handover latency; dynamic vs static join
	$(BIN)/python bench/rebalance.py $(ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
