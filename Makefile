# gradbridge: `make demo` and `make test` do all set-up on a fresh machine (Debian, Python 3.11, JDK 17).
PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
GRADLE  := gradle --no-daemon -q
# apt-get needs root; use sudo when not root.
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup gradle java dist publish demo test clean

setup: $(VENV)/.installed gradle

# The venv holds torch 2.7.1 (pinned with DJL in gradle.properties), JPype, numpy, pytest.
$(VENV)/.installed: pyproject.toml python/gradbridge/VERSION
	$(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

# Debian's gradle (4.4.1) is the Gradle these machines can install.
gradle:
	@command -v gradle >/dev/null 2>&1 || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q gradle; }

# The Java library, its runtime classpath file for the in-process JVM, and the seed model.
java: setup
	$(GRADLE) assemble installDist exportSeedModel

# A self-contained wheel: the Python package with the Java library and its runtime jars (not
# DJL's native libtorch jar: Java in Python uses the libtorch that `import torch` loaded).
# setuptools stages under build/lib; clear it so no stale module reaches the wheel.
dist: setup
	$(GRADLE) bundleJars :serve:bundleServeJars
	rm -rf build/lib build/bdist.* dist/gradbridge-*.whl
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .

# dev.gradbridge:gradbridge:<version> (+ sources, javadoc, POM) into ~/.m2 for Gradle/Maven users.
publish: setup
	$(GRADLE) publishToMavenLocal

demo: java
	$(PY) -m gradbridge demo --epochs 1000

# Every test: pytest runs the Python tests, the JPype parity tests, `gradle run`, and the JUnit
# suite through Gradle. pytest exits non-zero (5) when it collects no test, so that fails too.
test: java
	$(PY) -m pytest

clean:
	rm -rf build serve/build spark/build .gradle dist python/gradbridge/jars
