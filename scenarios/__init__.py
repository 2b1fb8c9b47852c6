"""Built-in scenarios, their traces and the decision guide's situations (``guide/``).

Installed as the package ``sim.scenarios`` (``pyproject.toml``: package-dir) so that a wheel
carries them; code finds this folder through :data:`sim.config.SCENARIO_DIR`.
"""
