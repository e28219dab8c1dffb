"""`python -m foxhunt ...`: the `foxhunt` command (torchrun starts training ranks this way)."""

import sys

from foxhunt.cli import main

sys.exit(main())
