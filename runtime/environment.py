"""What rhino runs with: the rhino, jax and jaxlib versions, jax's backend plugins, the
range of jax it is tested with, and XLA's native log level. Nothing here imports jax or
numpy: every command reads these (`--json` documents, `--version`), most before it needs
either (`rhino.runtime.xla_bridge` re-exports them)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

SUPPORTED_JAX = ("0.10.2", "0.12.0.1")
"""The oldest and the newest jax (== jaxlib) release rhino is tested with (CI runs both);
pyproject.toml allows this range."""


def versions() -> dict[str, str]:
    """The rhino, jax, jaxlib and Python versions in use: `{"rhino": "0.1.0", "jax":
    "0.12.0.1", "jaxlib": "0.12.0.1", "python": "3.12.1"}`. Read from the installed
    distributions without importing jax (cheap), or from jax itself once it is imported;
    a package that is missing reads "none"."""
    found = {name: _installed_version(name) for name in ("rhino", "jax", "jaxlib")}
    if "jax" in sys.modules:
        found["jax"] = str(getattr(sys.modules["jax"], "__version__", found["jax"]))
    found["python"] = ".".join(str(n) for n in sys.version_info[:3])
    return found


def _installed_version(name: str) -> str:
    """The version of the distribution `name` that Python would import: from the name of
    its first `NAME-VERSION.dist-info` folder on sys.path, as importlib.metadata finds
    it (whose import, 50 ms, was a tenth of `rhino parse --json`), or from
    importlib.metadata itself where there is no such folder; "none" where it is not
    installed."""
    folder = re.compile(rf"{re.escape(name)}-([^-]+)\.dist-info", re.IGNORECASE)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # not a folder (a zip), or gone
            continue
        for item in names:
            if m := folder.fullmatch(item):
                return m.group(1)
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def jax_plugins() -> dict[str, str]:
    """The installed jax backend plugins (CUDA, ROCm, TPU...) and their versions."""
    from importlib import metadata

    plugins = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith(("jax-cuda", "jax-rocm", "libtpu", "jax-tpu", "jax-metal")):
            plugins[name] = dist.version
    return dict(sorted(plugins.items()))


def untested_jax(found: Mapping[str, str] | None = None) -> str | None:
    """Why the jax in use is outside the tested range, or None when it is inside."""
    found = found or versions()

    def key(version: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:4])

    low, high = (key(v) for v in SUPPORTED_JAX)
    for name in ("jax", "jaxlib"):
        if found[name] == "none" or not low <= key(found[name]) <= high:
            return (
                f"{name} {found[name]} is outside the range rhino is tested with "
                f"({SUPPORTED_JAX[0]} to {SUPPORTED_JAX[1]})"
            )
    return None


def quiet_native_logs() -> None:
    """Keep XLA's own INFO and WARNING log lines (e.g. "GSPMD sharding propagation is
    going to be deprecated", printed on every compile) off stderr; its errors still show.
    Takes effect only before jax is first imported, and never overrides a
    TF_CPP_MIN_LOG_LEVEL the user set."""
    if "jax" not in sys.modules and "jaxlib" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
