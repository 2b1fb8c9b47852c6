"""The ``kvsim`` command line: ``sim.cli.main`` holds the app and registers each command group's module."""
