import multiprocessing
import sys

from app.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen executable must not re-run main in children
    sys.exit(main())
