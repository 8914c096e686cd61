"""The Bookings sample's CLI run as a user runs it (a process per command), and the request every test sends it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REQUEST = "I need physio on Tuesday afternoon, for Alex Doe"


def bookings(db: Path | str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("BOOKINGS_")} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "bookings", "--db", str(db), *args],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
        timeout=60,
    )


def session_id(output: str) -> str:
    found = re.search(r"session: (\S+)", output)
    assert found, output
    return found.group(1)
