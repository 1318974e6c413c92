"""``python -m alkstore_sa``: the ``alkstore`` command, for where its console script is
not on PATH (a virtualenv not activated, ``pipx run``, a container's ``python``)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
