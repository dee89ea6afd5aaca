# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# keras-hub's requirements pull the full `tensorflow` (through tensorflow-text): installed without them, the ones
# it needs are in pyproject.toml's test extra.
KERAS_HUB := keras-hub==0.32.0
# tftrt-serve's protos; its requirements pull the full `tensorflow` too (grpcio and protobuf: the serve extra).
SERVING_API := tensorflow-serving-api==2.21.0
# The Open Inference Protocol's protos (tftrt-serve) and clients (tests); its requirements cap protobuf below 7
# and ml_dtypes at 0.5.4 (what it needs: the serve and test extras).
TRITON_CLIENT := tritonclient==2.73.0

.PHONY: demo test clean

$(STAMP): pyproject.toml setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[cpu,serve,ray,test]"
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps "$(KERAS_HUB)" "$(SERVING_API)" \
		"$(TRITON_CLIENT)"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) models/demo.py $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
