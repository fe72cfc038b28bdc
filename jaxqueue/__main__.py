"""``python -m jaxqueue``: see :mod:`jaxqueue.cli`.

Importing the package exposes one CPU device per core (see
:func:`jaxqueue._one_device_per_core`), so the command puts every core to work.
"""

import sys

from jaxqueue.cli import main

sys.exit(main())
