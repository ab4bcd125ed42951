"""rhino.hlo."""
