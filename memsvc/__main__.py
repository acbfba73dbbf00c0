"""python -m memsvc."""

from memsvc.cli import main

# Guarded: a spawned child process (the extraction parser) imports the main module again.
if __name__ == "__main__":
    raise SystemExit(main())
