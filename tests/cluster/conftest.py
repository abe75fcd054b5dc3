"""Set the host up (``helpers.host``: 2 logical CPUs) before the cluster tier imports TensorFlow."""

import helpers.host  # noqa: F401
