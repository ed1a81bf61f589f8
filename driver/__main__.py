"""`python -m chattts_forge.driver ARGS`: `chattts-forge build ARGS` (what `make artifacts` runs), kept
for the command lines written before `build` was a subcommand."""

import sys

from chattts_forge.cli import main

main(["build", *sys.argv[1:]], prog_name="chattts-forge")
