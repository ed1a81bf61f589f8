"""`python -m chattts_forge.driver`: the whole pipeline (what `make artifacts` runs)."""

import sys

from chattts_forge.driver.pipeline import main

sys.exit(main())
