# Two commands do everything on a fresh Debian/Ubuntu machine: `make book` and `make test`.
# Both are idempotent and install what they need (a .venv, the package, Fashion-MNIST).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
FASHION_DEBIAN := /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
APT_GET := $(shell command -v apt-get 2>/dev/null)
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install data test book demo clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[test,book]"
	touch $(STAMP)

install: $(STAMP)

# Fashion-MNIST from Debian's package where apt works, else torchvision's download.
data: install
	@if [ ! -f $(FASHION_DEBIAN) ] && [ -n "$(APT_GET)" ]; then \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q dataset-fashion-mnist || true; \
	fi
	@if [ -f $(FASHION_DEBIAN) ]; then $(PY) -m barter_mini.cli data fashion-mnist; \
	else $(PY) -m barter_mini.cli data fashion-mnist --download; fi

test: data
	$(PY) -m pytest -q

# Until the book lands this runs a short BARTER training and its dense reference.
book: demo

demo: data
	$(VENV)/bin/barter-mini train --method barter --model cct-mini --dataset fashion-mnist \
	  --density 0.3 --epochs 1 --seed 0 --out runs/demo-barter
	$(VENV)/bin/barter-mini train --method dense --model cct-mini --dataset fashion-mnist \
	  --epochs 1 --seed 0 --out runs/demo-dense

clean:
	rm -rf runs _build .pytest_cache .hypothesis
