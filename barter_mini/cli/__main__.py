"""``python -m barter_mini.cli``: the ``barter-mini`` command without an installed script."""

import sys

from . import main

sys.exit(main())
