"""The layers ship their modules compiled for the Lambda runtime's Python, so no cold start compiles them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from infra.bundle import PYTHON_VERSION, bundle_app, bundle_library, compile_for_runtime, drop_provided, runtime_python

RUNTIME_PYTHON = runtime_python()
# CI requires this backend (DORMANT_REQUIRE_BACKENDS): the layers built there ship compiled modules.
needs_runtime_python = pytest.mark.skipif(
    RUNTIME_PYTHON is None,
    reason=f"no Python {PYTHON_VERSION} (DORMANT_LAYER_PYTHON, python{PYTHON_VERSION} on PATH, or pyenv)",
)


@pytest.mark.backend("runtime-python")
@needs_runtime_python
def test_the_app_layer_ships_unchecked_hash_pyc_that_the_runtime_python_loads(tmp_path: Path) -> None:
    source = tmp_path / "src" / "agentapp"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("")
    (source / "tools.py").write_text("ANSWER = 42\n")
    bundle_app(tmp_path / "out", [source])
    package = tmp_path / "out" / "python" / "agentapp"
    tag = f"cpython-{PYTHON_VERSION.replace('.', '')}"
    for name in ("__init__", "tools"):
        compiled = package / "__pycache__" / f"{name}.{tag}.pyc"
        assert compiled.exists(), compiled
        flags = int.from_bytes(compiled.read_bytes()[4:8], "little")
        assert flags == 0b01  # hash-based, unchecked: no file times involved, no source read at import
    # Read-only on Lambda: the runtime's Python must load these, not compile the sources again.
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "out" / "python"), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    done = subprocess.run(
        [str(RUNTIME_PYTHON), "-v", "-c", "import agentapp.tools"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert f"code object from '{package / '__pycache__' / f'tools.{tag}.pyc'}'" in done.stderr
    assert f"code object from {package / 'tools.py'}" not in done.stderr


def test_without_the_runtime_python_the_layer_ships_sources_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "module.py").write_text("X = 1\n")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.delenv("DORMANT_LAYER_PYTHON", raising=False)
    assert compile_for_runtime(tmp_path) is False
    assert "ships no .pyc" in capsys.readouterr().err
    assert not (tmp_path / "__pycache__").exists()


# What the Lambda Python runtime ships (its SDK and the SDK's dependencies), as top-level entries of a layer.
RUNTIME_PROVIDED = {"boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six", "six.py"}
RUNTIME_PROVIDED_DISTS = {"boto3", "botocore", "s3transfer", "jmespath", "python_dateutil", "urllib3", "six"}


@pytest.mark.backend("runtime-python")
@needs_runtime_python
def test_the_library_layer_ships_no_package_the_lambda_runtime_provides(tmp_path: Path) -> None:
    # The real build: pip resolves aws-lambda-powertools[tracer] for cp312 aarch64, which pulls in
    # aws-xray-sdk -> botocore -> urllib3, jmespath, python-dateutil -> six.
    bundle_library(tmp_path / "out")
    layer = tmp_path / "out" / "python"
    top = {p.name for p in layer.iterdir()}
    assert {"dormant", "aws_lambda_powertools", "aws_xray_sdk", "pydantic", "pydantic_core", "wrapt"} <= top
    assert not top & RUNTIME_PROVIDED, sorted(top & RUNTIME_PROVIDED)
    dists = {p.name.split("-")[0].lower() for p in layer.glob("*.dist-info")}
    assert not dists & RUNTIME_PROVIDED_DISTS, sorted(dists & RUNTIME_PROVIDED_DISTS)
    size = sum(p.stat().st_size for p in layer.rglob("*") if p.is_file())
    assert size < 25 * 2**20, f"{size / 2**20:.1f} MiB"  # 46 MiB when it shipped its own botocore


def _dist(target: Path, name: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> None:
    info = target / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: " + name + "\nVersion: 1.0\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )
    for path, text in files.items():
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(text)
    record = [*files, f"{info.name}/METADATA", f"{info.name}/RECORD"]
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in record))


def test_dropping_the_provided_packages_removes_their_files_and_keeps_the_rest(tmp_path: Path) -> None:
    _dist(tmp_path, "botocore", {"botocore/__init__.py": "", "botocore/data/s3.json": "{}"}, ("urllib3>=1.25.4",))
    _dist(tmp_path, "python_dateutil", {"dateutil/__init__.py": "", "dateutil/tz/tz.py": ""}, ("six>=1.5",))
    _dist(tmp_path, "six", {"six.py": ""})
    _dist(
        tmp_path,
        "aws_xray_sdk",
        {"aws_xray_sdk/__init__.py": ""},
        ("botocore>=1.11.3", "wrapt", 'urllib3<1.27; python_version < "3.10"', 'boto3<1.0; extra == "old"'),
    )
    assert sorted(drop_provided(tmp_path)) == ["botocore", "python-dateutil", "six"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "aws_xray_sdk",
        "aws_xray_sdk-1.0.dist-info",
        "aws_xray_sdk-1.0.dist-info/METADATA",
        "aws_xray_sdk-1.0.dist-info/RECORD",
        "aws_xray_sdk/__init__.py",
    ]


def test_a_package_needing_a_newer_sdk_than_the_runtime_has_fails_the_build(tmp_path: Path) -> None:
    _dist(tmp_path, "botocore", {"botocore/__init__.py": ""})
    _dist(tmp_path, "needs_new_sdk", {"needs_new_sdk.py": ""}, ("botocore>=99",))
    with pytest.raises(SystemExit, match=r"needs_new_sdk requires botocore>=99"):
        drop_provided(tmp_path)
