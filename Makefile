# Two commands on a fresh machine:  `make demo`  and  `make test`. Each creates .venv and installs what it needs:
# the demo its runtime only (requirements.txt), the tests that plus their toolchain (requirements-dev.txt).
VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export WANDB_MODE := offline

.PHONY: demo test lint

# the demo's runtime: torch (CPU), transformers, accelerate, datasets, matplotlib, and the package itself
$(VENV)/.runtime: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# + the test toolchain (pytest, ruff, DeepSpeed, trl, tensorboard) and the torchao extras
$(VENV)/.installed: $(VENV)/.runtime requirements-dev.txt requirements-tf4.txt
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-deps --target $(VENV)/extras torchao==0.18.0
	@# transformers 4.x beside the venv's 5.x: the checkpoints we write must load the same in both
	$(PY) -m pip install -q --no-deps --target $(VENV)/tf4 -r requirements-tf4.txt
	@# DeepSpeed's CPU ops (ZeRO-Offload's DeepSpeedCPUAdam, the shared-memory collectives) are C++ that DeepSpeed
	@# JIT-builds on first use (~40-190 s on 2 cores): built here once, into the cache `make test` points the tests at
	TORCH_EXTENSIONS_DIR=$(CURDIR)/$(VENV)/torch_extensions $(PY) -c "from deepspeed.accelerator import \
	get_accelerator as a; [a().create_op_builder(n).load() for n in ('CPUAdamBuilder', 'ShareMemCommBuilder')]" >/dev/null
	touch $@

demo: $(VENV)/.runtime
	$(PY) bench/cpu_sp_demo.py
	PY=$(PY) bash train_scripts/demo_cpu.sh

test: $(VENV)/.installed
	$(PY) -m ruff check easy_context tests bench examples train.py PaulGrahamEssays
	@# 2 workers, a file's tests on one (its module fixtures built once); tests/SLOW_TESTS.md: the slow ones, and why
	TORCH_EXTENSIONS_DIR=$(CURDIR)/$(VENV)/torch_extensions EC_EXTRAS=$(CURDIR)/$(VENV)/extras EC_TF4=$(CURDIR)/$(VENV)/tf4 \
		$(PY) -m pytest tests \
		-n 2 --dist loadfile

lint: $(VENV)/.installed
	$(PY) -m ruff check easy_context tests bench examples
	$(PY) -m ruff format --check easy_context tests bench examples
