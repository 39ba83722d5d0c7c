"""The `radixkv` command line (subcommands are added as the runtime grows)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixkv", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    args = parser.parse_args(argv)
    if args.version:
        from radixkv import __version__

        print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
