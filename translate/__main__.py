"""`python -m translate VERB ...` (also under torchrun)."""

from translate.cli import main

main()
