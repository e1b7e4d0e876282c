"""``python -m gateway.cli``: the same as the ``bpgw`` command."""

import sys

from gateway.cli import main

sys.exit(main())
