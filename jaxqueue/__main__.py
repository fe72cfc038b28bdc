"""``python -m jaxqueue``: see :mod:`jaxqueue.cli`."""

import os
import sys

# On a CPU, XLA runs one device per thread: expose one device per core so that
# replicas are spread over all cores. Must happen before JAX starts.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_force_host_platform_device_count={os.cpu_count() or 1}"
    ).strip()

from jaxqueue.cli import main  # noqa: E402

sys.exit(main())
