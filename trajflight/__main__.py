"""``python -m trajflight`` is the ``trajflight`` command."""

import sys

from trajflight.cli import main

sys.exit(main())
