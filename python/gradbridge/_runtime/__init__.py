"""gradbridge's runtime plumbing: no API, may change in any release.

The JDK and the classpath, the libtorch and native library Java runs on, the ``java`` command line,
the torch gate, atomic files, TorchScript calls, data checks and protocol 3's op lists. The public
modules at the top of ``gradbridge`` (``reference``, ``java``, ``jvm``, ``parity``, ``export`` ...)
use these; this package reads only the shared definitions above it (errors, messages,
protocol, the version, the History type), so imports go one way (tests/test_layout.py).
"""
