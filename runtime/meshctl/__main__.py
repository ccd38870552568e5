"""`python -m runtime.meshctl`: the same as the `meshctl` console script."""

import sys

from runtime.meshctl.cli import main

sys.exit(main())
