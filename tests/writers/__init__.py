"""Real trainers' checkpoint writers, run as their own processes (see each module's docstring)."""
