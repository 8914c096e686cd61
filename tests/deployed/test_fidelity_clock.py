"""The harness's moved clock (``Deployment.advance``): time the busy day lets pass for the functions (claims'
deadlines, waits' graces) passes in every sandbox, warm or cold, and stays passed for the sandbox's life."""

from __future__ import annotations

from pathlib import Path

from tests.support.fidelity.lambda_ import LambdaService
from tests.support.fidelity.template import Function

ROOT = Path(__file__).resolve().parents[2]

_HANDLER = """
from dormant import clock

def handler(event, context):
    return {"moved_ms": clock.now_ms() - clock.system_ms()}
"""


def test_advance_moves_dormants_clock_in_warm_and_cold_sandboxes(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "app.py").write_text(_HANDLER)
    arn = "arn:aws:lambda:eu-west-1:123456789012:function:Dormant-Clock"
    function = Function(
        name="probe",
        logical_id="Probe",
        function_name="Dormant-Clock",
        arn=arn,
        handler="app.handler",
        timeout=60,
        memory=256,
        environment={},
        code_dir=code,
        layers=["Dormant"],
        role="ProbeRole",
        statements=[],
    )
    services = [LambdaService({"probe": function}, {"Dormant": ROOT / "layers/dormant/python"}, {}, tmp_path)]
    try:

        def moved() -> float:
            done = services[-1].invoke("probe", {})
            assert done.ok, done.error()
            return float(done.payload["moved_ms"]) / 1000

        assert abs(moved()) < 5  # not moved yet
        services[0].advance(1200)
        assert 1195 < moved() < 1205  # the warm sandbox, on its next invocation
        services[0].advance(300)
        assert 1495 < moved() < 1505  # moved on again
        # a cold sandbox (a fresh service on the same working directory, so the same clock file)
        services.append(LambdaService({"probe": function}, {"Dormant": ROOT / "layers/dormant/python"}, {}, tmp_path))
        assert 1495 < moved() < 1505
        assert services[-1].cold_starts == {"probe": 1}
    finally:
        for service in services:
            service.close()
