"""Command line: `python -m histories.importers SRC OUT [--task T] [--fork N] [--arm A]` imports
one file; `python -m histories.importers --study-all SRC_DIR OUT_DIR` converts every study record
into OUT_DIR/<record-stem>/{clean,external}.json."""

from __future__ import annotations

import argparse
import sys

from histories.format import HistoryError, save_history
from histories.importers import import_history, write_study_histories


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run one import, return the exit code."""
    parser = argparse.ArgumentParser(prog="python -m histories.importers",
                                     description="Import agent records as history files.")
    parser.add_argument("src", help="file to import (with --study-all: folder of records)")
    parser.add_argument("out", help="history file to write (with --study-all: output folder)")
    parser.add_argument("--study-all", action="store_true",
                        help="convert every *__rep-*.json study record in SRC")
    parser.add_argument("--task", help="task id (default: from the file)")
    parser.add_argument("--fork", type=int, help="assistant message index to fork at")
    parser.add_argument("--arm", help="arm name (study record: clean or external)")
    args = parser.parse_args(argv)
    try:
        if args.study_all:
            for path in write_study_histories(args.src, args.out):
                print(path)
        else:
            history = import_history(args.src, task=args.task, fork=args.fork, arm=args.arm)
            save_history(history, args.out)
            print(args.out)
    except (HistoryError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
