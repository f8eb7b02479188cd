"""The wording of error lines that both languages print, in one place.

``dev.gradbridge.internal.Messages`` holds the same sentences for Java; ``tests/test_faults_data_files.py``
and ``tests/test_faults_metadata.py`` check that both sides print the same line for the same
bad input. Every line names the file, key, array or argument at fault, and what was expected
versus what was found.

One module per surface; callers write ``messages.NAME`` whichever module holds it.
"""

from .runs import *  # noqa: F401,F403
from .platform import *  # noqa: F401,F403
from .sharded import *  # noqa: F401,F403
from .exporting import *  # noqa: F401,F403
from .protocol3 import *  # noqa: F401,F403
