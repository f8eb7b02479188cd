# gradbridge: `make demo` and `make test` do all set-up on a fresh machine (Debian, Python 3.11, JDK 17).
PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
# The newest torch of the supported range (python/gradbridge/requirements.txt), for the tests
# marked every_torch; the default venv holds the oldest, PINNED_TORCH below.
NEWEST  := .venv-newest
PY_NEWEST := $(NEWEST)/bin/python
# The lower end of the supported range: gradle.properties' torchVersion, the libtorch release of the
# pytorch-native-cpu jar that a JVM of its own runs in a checkout (tests/test_pins.py and test_torch_range.py tie them).
PINNED_TORCH := $(shell sed -n 's/^torchVersion=//p' gradle.properties)
# The tests that `make test` runs on the newest torch too: the range's checks and the fast
# in-process Java parity cases (every_torch_java).
NEWEST_TESTS := every_torch or every_torch_java
# `make test PYTEST_ARGS=--full`: the whole parity matrix, on the oldest and the newest torch.
PYTEST_ARGS ?=
GRADLE  := gradle --no-daemon -q
# apt-get needs root; use sudo when not root.
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup newest gradle java dist publish demo test clean

setup: $(VENV)/.installed gradle

# The model zoo's vision libraries (tests/models/zoo.py; transformers is in the test extra): timm and
# torchvision go in without dependencies, so they never move the venv's torch. PyPI has torchvision
# builds up to 0.29.2 (torch 2.14); the newest venv runs that one beside a newer torch.
TIMM := timm==1.0.31
TORCHVISION_OLDEST := torchvision==0.22.1
TORCHVISION_NEWEST := torchvision==0.29.2
# The zoo's transformers: both majors users run, the last 4.x beside the oldest torch and the 5.x
# release beside the newest (with the PEFT release of each).
HF_OLDEST := transformers==4.57.6 peft==0.17.1
HF_NEWEST := transformers==5.25.0 peft==0.21.2

# The venv holds torch $(PINNED_TORCH) (the oldest of the range, gradle.properties), JPype, numpy, pytest.
$(VENV)/.installed: pyproject.toml python/gradbridge/VERSION python/gradbridge/requirements.txt gradle.properties Makefile
	$(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' 'torch==$(PINNED_TORCH)' $(HF_OLDEST)
	$(PY) -m pip install --quiet --no-deps '$(TIMM)' '$(TORCHVISION_OLDEST)'
	touch $@

# A second venv: the same checkout on the newest torch that the supported range allows (pip picks
# it; its cache makes a re-creation cheap).
newest: $(NEWEST)/.installed
$(NEWEST)/.installed: pyproject.toml python/gradbridge/VERSION python/gradbridge/requirements.txt Makefile
	$(PYTHON3) -m venv $(NEWEST)
	$(PY_NEWEST) -m pip install --quiet --upgrade pip
	$(PY_NEWEST) -m pip install --quiet --upgrade -e '.[test]' $(HF_NEWEST)
	$(PY_NEWEST) -m pip install --quiet --no-deps '$(TIMM)' '$(TORCHVISION_NEWEST)'
	touch $@

# Debian's gradle (4.4.1) is the Gradle these machines can install; gpg checks signed publications.
gradle:
	@command -v gradle >/dev/null 2>&1 || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q gradle; }
	@command -v gpg >/dev/null 2>&1 || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q gnupg; }

# The Java library, its runtime classpath file for the in-process JVM, and the seed model.
java: setup
	$(GRADLE) assemble installDist exportSeedModel

# A self-contained wheel: the Python package with the Java library, its runtime jars and the native
# library prebuilt for this venv's torch and the newest venv's (not the libtorch jar: Java in Python
# uses the libtorch that `import torch` loaded; another torch compiles it on first use).
# setuptools stages under build/lib; clear it so no stale module reaches the wheel.
dist: setup
	$(GRADLE) bundleJars :serve:bundleServeJars
	@# prebuilt for the newest torch of the range too, when its venv is there (make newest)
	if [ -x $(PY_NEWEST) ]; then $(PY_NEWEST) -m gradbridge.native build --out python/gradbridge/native_lib; fi
	rm -rf build/lib build/bdist.* dist/gradbridge-*.whl
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .

# dev.gradbridge:gradbridge:<version> (+ sources, javadoc, POM) into ~/.m2 for Gradle/Maven users.
publish: setup
	$(GRADLE) publishToMavenLocal

demo: java
	$(PY) -m gradbridge demo --epochs 1000

# Every test: pytest runs the Python tests, the JPype parity tests, `gradle run`, and the JUnit
# suite through Gradle; then the every_torch tests on the newest torch. pytest exits non-zero (5)
# when it collects no test, so that fails too. Each stage ends with its 25 slowest tests (where CI's
# 45 minutes go).
test: java newest
	$(PY) -m pytest --durations=25 $(PYTEST_ARGS)
	$(PY_NEWEST) -m pytest -m '$(NEWEST_TESTS)' --durations=10 $(PYTEST_ARGS)

clean:
	rm -rf build serve/build spark/build .gradle dist python/gradbridge/jars python/gradbridge/native_lib
