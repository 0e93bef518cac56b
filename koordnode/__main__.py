"""``python -m koordnode``: the same as the ``koordnode`` command."""

import sys

from koordnode.cli import main

sys.exit(main())
