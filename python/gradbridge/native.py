"""``python -m gradbridge.native build --out DIR``: build gradbridge's native library for this Python's
torch (the command Gradle, the Makefile and Java's error lines name). The library itself is
gradbridge's runtime plumbing (``gradbridge._runtime.native``)."""

import sys

from ._runtime.native import main

if __name__ == "__main__":
    sys.exit(main())
