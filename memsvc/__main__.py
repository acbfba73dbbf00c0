"""python -m memsvc."""

from memsvc.cli import main

raise SystemExit(main())
