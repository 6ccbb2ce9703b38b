"""Optional third-party modules the tests use (tests/ is on sys.path, beside conftest.py).

A test that needs one is skipped where it is not installed, unless EEMICROGPT_REQUIRE_EXTRAS (a comma list of
module names, or `all`) names it: scripts/test.sh names the ones scripts/setup.sh installs, so in CI a missing
extra is a failure, never a silent skip. The same rule as EEMICROGPT_REQUIRE_BACKENDS for backends.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRE_ENV = "EEMICROGPT_REQUIRE_EXTRAS"


def required(module: str) -> bool:
    wanted = {w.strip() for w in os.environ.get(REQUIRE_ENV, "").split(",") if w.strip()}
    return "all" in wanted or module.split(".")[0] in wanted


def import_extra(module: str, install: str) -> ModuleType:
    """The module; a missing one skips the test, or fails it when REQUIRE_ENV names it. install: the pip hint."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if required(module):
            pytest.fail(f"{module} is required by {REQUIRE_ENV} but cannot be imported ({e}): {install}",
                        pytrace=False)
        pytest.skip(f"{module} is not installed: {install}", allow_module_level=True)
