"""rhino.cli."""
