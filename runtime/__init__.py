"""rhino.runtime."""
