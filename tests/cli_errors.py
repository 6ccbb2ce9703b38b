"""The CLI's user-error contract, checked the same way by every test that needs it (tests/ is on sys.path)."""

from __future__ import annotations

from typing import Any


def one_line_error(result: Any, *fragments: str) -> str:
    """A CliRunner result that failed as a user error: exit status 2 and one stderr line holding every fragment."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eemicrogpt: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
