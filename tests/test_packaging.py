"""What a non-editable install ships: the C++ sources are compiled at run time, so a wheel
without them silently runs the slow PyTorch paths (wheels lacked them until session 26)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from specserve.layers import paged_attention_ext

ROOT = Path(__file__).resolve().parents[1]


def test_package_data_ships_every_kernel_source():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = data["package-data"]["specserve.layers"]
    layers = ROOT / "specserve" / "layers"
    for path in paged_attention_ext._SOURCE_PATHS:
        rel = path.relative_to(layers).as_posix()
        assert path.is_file() and any(fnmatch.fnmatch(rel, g) for g in globs), rel
