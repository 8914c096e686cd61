"""``make invoke FUNCTION=sessions EVENT=events/api/get_session.json``: run one handler on one event, here.

The handler is loaded from ``functions/<name>/app.py`` exactly as Lambda would load it, and serves
``DORMANT_APP`` on ``DORMANT_STORE`` (default: the Bookings sample on ``data/dormant.db``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python functions/invoke.py FUNCTION EVENT.json", file=sys.stderr)
        return 2
    name, event_path = argv
    path = Path(__file__).resolve().parent / name / "app.py"
    spec = importlib.util.spec_from_file_location(f"dormant_function_{name}", path)
    if spec is None or spec.loader is None or not path.exists():
        print(f"no function {name!r} (looked for {path})", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    context = SimpleNamespace(
        function_name=f"dormant-{name}",
        memory_limit_in_mb=512,
        invoked_function_arn=f"arn:aws:lambda:local:000000000000:function:dormant-{name}",
        aws_request_id="local-invoke",
    )
    event = json.loads(Path(event_path).read_text(encoding="utf-8"))
    print(json.dumps(module.handler(event, context), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
