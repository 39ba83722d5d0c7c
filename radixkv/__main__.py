"""`python -m radixkv ...` is the `radixkv` command."""

import sys

from radixkv.cli import main

sys.exit(main())
