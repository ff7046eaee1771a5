"""`python -m rlvitals.presets`: write docs/presets.md from the presets (`--check`: exit 1 when it is stale)."""

import sys

from .docs import main

sys.exit(main())
