"""``python -m sim.cli`` runs ``kvsim``."""

from sim.cli.main import main

main()
