# Every target creates or refreshes the venv it needs; nothing else is assumed on the machine.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: constraints test-compose demo test test-solace test-messagedb test-slow soak lint bench bench-rebalance bench-resize venv clean up scale down autoscale deploy-check dataset replay spark-cluster spark-cluster-down peak bench-replay

# The bare install is the daemons only; the make targets and the tests use every extra:
# [replay] (Spark, Arrow), [loadtest] (Locust, matplotlib) and [test]. Versions are pinned by
# constraints.txt, the set the tests passed with.
EXTRAS := test,replay,loadtest

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	$(BIN)/python -m compileall -q services  # as pip does for an installed package: a daemon starts without compiling (PYTHONDONTWRITEBYTECODE may be set)
	@touch $(STAMP)

venv: $(STAMP)

constraints:  ## re-pin constraints.txt: install the newest allowed versions, test, then commit it
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade -e '.[$(EXTRAS)]'
	sed -n '/^#/p' constraints.txt > constraints.txt.new
	$(BIN)/python -m pip freeze --exclude-editable >> constraints.txt.new
	mv constraints.txt.new constraints.txt
	@touch $(STAMP)

demo: $(STAMP)  ## the main job: the whole pattern end to end on the embedded broker
	$(BIN)/lbg demo $(ARGS)

# RabbitMQ for the tests: Debian's package; the tests start a private node, never the service.
RABBITMQ_SERVER := /usr/lib/rabbitmq/bin/rabbitmq-server
$(RABBITMQ_SERVER):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server

# Headless Chromium for the live-view test: Debian's package.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# A Java runtime for Spark (the replay tests): Debian's OpenJDK 17.
JAVA := /usr/bin/java
$(JAVA):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless

# PostgreSQL and npm for the Message DB tests: Debian's packages; the tests start a private
# cluster, never the service, and install Message DB into it from npm (@eventide/message-db).
POSTGRES_INITDB := /usr/lib/postgresql/15/bin/initdb
$(POSTGRES_INITDB):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql npm

# iptables for the partition test's kernel-made variant (DROP on loopback): Debian's package.
IPTABLES := /usr/sbin/iptables
$(IPTABLES):
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables

test: $(STAMP) $(RABBITMQ_SERVER) $(CHROMIUM) $(JAVA) $(POSTGRES_INITDB) $(IPTABLES)  ## lint, then every test that the default run includes
	$(BIN)/ruff check services tests bench examples loadtest
	$(BIN)/python -m pytest -n 2 --dist loadgroup $(ARGS)

test-solace: $(STAMP)  ## the behaviour suite on a real Solace broker: needs LBG_TEST_SOLACE_* (README)
	LBG_TEST_BROKERS=solace $(BIN)/python -m pytest -m "solace or not slow" tests/integration $(ARGS)

test-messagedb: $(STAMP) $(CHROMIUM) $(POSTGRES_INITDB) $(IPTABLES)  ## the behaviour suite on Message DB (about 6 minutes)
	LBG_TEST_BROKERS=messagedb $(BIN)/python -m pytest tests/integration $(ARGS)

test-slow: $(STAMP) $(RABBITMQ_SERVER) $(JAVA) $(IPTABLES)  ## the long soak, scale and failure tests the default run leaves out (~10 min; CI runs them)
	$(BIN)/python -m pytest -m slow $(ARGS)

SOAK_SECONDS ?= 600
soak: $(STAMP) $(RABBITMQ_SERVER)  ## chaos soak (10 min): make soak SOAK_SECONDS=3600 ARGS="--broker rabbitmq"
	$(BIN)/lbg soak --duration $(SOAK_SECONDS) $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check services tests bench examples loadtest
	$(BIN)/ruff format --check services tests bench examples loadtest

bench: $(STAMP)  ## end-to-end throughput: sticky vs competing consumers vs the raw client library
	$(BIN)/python bench/throughput.py $(ARGS)

bench-rebalance: $(STAMP)  ## join, crash and planned-handover latency; dynamic vs static join
	$(BIN)/python bench/rebalance.py $(ARGS)

bench-resize: $(STAMP)  ## how long each bucket pauses while a NATS group is resized under load
	$(BIN)/python bench/resize.py $(ARGS)

up: $(STAMP)  ## a local stack in the background: broker, group, publisher, validator, clients
	$(BIN)/lbg local up $(ARGS)

scale: $(STAMP)  ## set the local stack's client count at run time: make scale N=4
	@test -n "$(N)" || { echo "usage: make scale N=<clients>"; exit 2; }
	$(BIN)/lbg local scale $(N)

autoscale: $(STAMP)  ## scale the local stack's clients on the group's lag (backlog, oldest event) until Ctrl-C
	$(BIN)/lbg autoscale $(ARGS)

down: $(STAMP)  ## stop the local stack
	$(BIN)/lbg local down

# PROFILES="nats rabbitmq" runs both, one after the other (CI runs nats).
PROFILES ?= nats
test-compose: $(STAMP)  ## compose.yaml for real (PROFILES=nats) on a Docker daemon of its own, local stand-in images (~3-5 min)
	bash compose/stand-ins/test-compose.sh $(BIN)/python $(PROFILES)

deploy-check: $(STAMP)  ## Dockerfile, compose/ and ansible/: schema, lint, real local runs (~1 min)
	$(BIN)/python -m pytest tests/deploy $(ARGS)

# Spark needs Java 17 or 21 (Debian: openjdk-17-jre-headless); it finds `java` on the PATH.
ROWS ?= 200000
DATASET ?= var/dataset/black_friday.parquet

dataset: $(STAMP)  ## the sample Black Friday order events as Parquet: make dataset ROWS=1000000
	$(BIN)/lbg-dataset --output $(DATASET) --rows $(ROWS) $(ARGS)

replay: $(STAMP)  ## Spark replay of the dataset into an embedded broker, clients and validator
	@test -f $(DATASET) || $(MAKE) dataset ARGS=
	$(BIN)/python -m lbg.cli.replay_local $(DATASET) $(ARGS)

spark-cluster: $(STAMP) $(JAVA)  ## a standalone Spark master and 2 workers on loopback (var/spark)
	$(BIN)/lbg spark-cluster up $(ARGS)

spark-cluster-down: $(STAMP)  ## stop what make spark-cluster started
	$(BIN)/lbg spark-cluster down $(ARGS)

peak: $(STAMP)  ## Locust peak with the autoscaler on; picture, per-second CSV and verdict in var/peak/
	$(BIN)/python loadtest/run_peak.py $(ARGS)

bench-replay: $(STAMP) $(JAVA)  ## Spark replay rows/s at local[2] and on a 2-worker cluster against the raw hashed publisher
	$(BIN)/python bench/replay.py $(ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
