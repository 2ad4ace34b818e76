import multiprocessing
import sys

from app.process.streams import ensure_streams

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen executable must not re-run main in children
    ensure_streams()  # a windowed executable has none: never print to a missing stream
    from app.cli import main

    sys.exit(main())
