"""``python -m benchmarks``: see ``benchmarks/cli.py``."""

from benchmarks.cli import main

if __name__ == "__main__":  # spawned benchmark processes re-import this module as __mp_main__
    raise SystemExit(main())
