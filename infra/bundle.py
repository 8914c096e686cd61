"""Build the library layer on this machine, without Docker, for the Lambda runtime (Python 3.12, arm64).

pip fetches wheels built for that runtime (``--platform``/``--only-binary``), then the library is copied
beside them, and every module is compiled for the runtime's Python. ``cdk synth``/``cdk deploy`` run
this as the layer's local bundling step (infra/layer.py);
``python -m infra.bundle DIR`` runs it on its own, to inspect the layer or pre-build it. It imports no
CDK, so it needs no Node.

boto3 is left out: the Lambda runtime ships it, and a second copy would only add cold-start bytes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ROOT / "layers" / "dormant" / "python" / "dormant"
PYTHON_VERSION = "3.12"
PLATFORM = "manylinux2014_aarch64"
LEFT_OUT = ("inspector",)
"""Parts of the library no Lambda function uses: the inspector's web page is served by ``dormant serve`` only."""
# Shipped by the Lambda runtime itself.
_PROVIDED = {"boto3", "botocore", "s3transfer", "jmespath", "urllib3", "python-dateutil", "six"}


def layer_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The library's dependencies plus its ``lambda`` extra, as pyproject.toml declares them."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["lambda"]]
    return [req for req in wanted if _name(req) not in _PROVIDED]


def _name(requirement: str) -> str:
    for stop in "[<>=!~; ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.lower()


def bundle_library(output_dir: Path, requirements: Sequence[str] | None = None) -> None:
    """Write the library layer into ``output_dir/python``: wheels for the Lambda runtime, then ``dormant``."""
    target = output_dir / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--platform",
            PLATFORM,
            "--implementation",
            "cp",
            "--python-version",
            PYTHON_VERSION,
            "--only-binary=:all:",
            "--target",
            str(target),
            *(layer_requirements() if requirements is None else requirements),
        ],
        check=True,
        timeout=600,
    )
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts: nothing in a layer runs them
    copy_packages(target, [LIBRARY], leave_out=LEFT_OUT)
    compile_for_runtime(target)


def bundle_app(output_dir: Path, packages: Sequence[Path]) -> None:
    """Write the app layer into ``output_dir/python``: the agent app's packages, compiled."""
    copy_packages(output_dir / "python", packages)
    compile_for_runtime(output_dir / "python")


def copy_packages(target: Path, packages: Sequence[Path], leave_out: Sequence[str] = ()) -> None:
    """Copy each package into ``target``, without bytecode and without its subpackages named in ``leave_out``."""
    for package in packages:

        def ignore(directory: str, names: list[str], package: Path = package) -> set[str]:
            top = Path(directory) == package
            return {n for n in names if n == "__pycache__" or n.endswith(".pyc") or (top and n in leave_out)}

        shutil.copytree(package, target / package.name, ignore=ignore)


def runtime_python() -> str | None:
    """A Python of the runtime's version: ``DORMANT_LAYER_PYTHON``, else ``python3.12`` on PATH, else one
    pyenv installed (``$PYENV_ROOT/versions/3.12.*``, which its shim hides unless selected), if it runs."""
    name = f"python{PYTHON_VERSION}"
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [os.environ.get("DORMANT_LAYER_PYTHON"), shutil.which(name)]
    candidates += [str(p) for p in sorted(pyenv.glob(f"{PYTHON_VERSION}.*/bin/{name}"), reverse=True)]
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    for python in filter(None, candidates):
        try:
            done = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == PYTHON_VERSION:
            return python
    return None


def compile_for_runtime(target: Path) -> bool:
    """Compile every module under ``target`` with the runtime's Python (``runtime_python()``); ``False``,
    with a warning, when this machine has none.

    A layer is read-only on Lambda, where Python cannot keep what it compiles: a module shipped without
    its ``.pyc`` is compiled again by every cold start (here that nearly doubled a handler's import). The
    ``.pyc`` are hash-based and unchecked: they do not depend on file times, which the asset's zip does
    not keep, and nothing changes a layer's sources after it is built.
    """
    python = runtime_python()
    if python is None:
        print(
            f"infra.bundle: no Python {PYTHON_VERSION} (DORMANT_LAYER_PYTHON, python{PYTHON_VERSION} on PATH, "
            f"or pyenv): {target} ships no .pyc, so every cold start compiles its modules",
            file=sys.stderr,
        )
        return False
    subprocess.run(
        [python, "-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash", str(target)],
        check=True,
        timeout=600,
    )
    return True


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m infra.bundle DIR``: build the library layer into DIR (it must not exist yet)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m infra.bundle OUTPUT_DIR")
    out = Path(args[0])
    if out.exists():
        raise SystemExit(f"{out} exists already; pass a new directory")
    bundle_library(out)
    print(f"library layer written to {out}")


if __name__ == "__main__":
    main()
