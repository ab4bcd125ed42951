"""Model families of the zoo: plain-JAX training steps lowered to HLO text by scripts/zoo.py.

Each family module exposes ``CONFIGS`` (named frozen config dataclasses) and
``build(config) -> ModelSpec``; ``common`` holds the shared layers and the Adam step.
"""
