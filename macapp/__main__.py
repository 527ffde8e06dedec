"""`python -m macapp` is the `qwen-desk` command."""

import sys

from macapp.cli import main

sys.exit(main())
