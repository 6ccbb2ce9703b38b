"""Checks of how the `eemicrogpt` command ended, for CliRunner results and subprocesses alike (tests/ is on
sys.path, beside conftest.py)."""

from __future__ import annotations

from typing import Any


def one_line_error(result: Any, *fragments: str, code: int = 2) -> str:
    """The command exited with `code` after exactly one `eemicrogpt: error:` line on stderr holding every
    fragment, and no traceback; returns that line."""
    status = result.exit_code if hasattr(result, "exit_code") else result.returncode
    stdout = result.stdout if isinstance(result.stdout, str) else result.stdout.decode()
    stderr = result.stderr if isinstance(result.stderr, str) else result.stderr.decode()
    assert status == code, (status, stdout, stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("eemicrogpt: error: "), stderr
    assert "Traceback" not in stdout + stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
