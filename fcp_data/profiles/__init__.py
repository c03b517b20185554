"""fcp_data.profiles: the measured cost profiles that ship with fcp, by name or by path.

What `--cost cpu-small` and `--cost my-profile.json` take, and `CostModel.load` too.

A name is looked up among the profiles shipped in the package (fcp_data/profiles/NAME.json,
read through importlib.resources, so it works from a wheel); anything else is a path, relative
to the working directory. A spec that is neither is a ConfigError that names the file it
looked for and every shipped profile. Importing this module imports neither torch nor numpy.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import ConfigError

__all__ = ["resolve_cost", "shipped_names", "shipped_profile"]


def shipped_names() -> list[str]:
    """Names of the cost profiles that ship with fcp (e.g. ["cpu-small"])."""
    base = resources.files("fcp_data") / "profiles"
    return sorted(p.name.removesuffix(".json") for p in base.iterdir() if p.name.endswith(".json"))


def shipped_profile(name: str = "cpu-small") -> Path:
    """Path of a measured profile shipped in fcp_data/profiles (`CostModel.load` reads it)."""
    path = Path(str(resources.files("fcp_data") / "profiles" / f"{name}.json"))
    if not path.is_file():
        raise ConfigError(f"no shipped cost profile {name!r}; shipped: {shipped_names()}")
    return path


def resolve_cost(spec: str | Path, *, what: str = "--cost") -> Path:
    """The profile file `spec` names: an existing path first, then a shipped profile's name.

    `what` names the caller in the error (`--cost` for the CLI, `CostModel.load` in Python)."""
    path = Path(spec)
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(f"{what} {spec}: is a directory; pass a profile JSON or a shipped name")
    name = str(spec).removesuffix(".json")
    if "/" not in name and name in shipped_names():
        return shipped_profile(name)
    raise ConfigError(
        f"{what} {spec}: no file {path.resolve()} and no shipped profile of that name; "
        f"shipped: {', '.join(shipped_names())} (or write one with `fcp profile -o FILE`)"
    )
