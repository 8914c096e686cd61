"""Build the library layer on this machine, without Docker, for the Lambda runtime (Python 3.12, arm64).

pip fetches wheels built for that runtime (``--platform``/``--only-binary``), then the library is copied
beside them, and every module is compiled for the runtime's Python. ``cdk synth``/``cdk deploy`` run
this as the layer's local bundling step (infra/layer.py);
``python -m infra.bundle DIR`` runs it on its own, to inspect the layer or pre-build it. It imports no
CDK, so it needs no Node.

Nothing the Lambda runtime provides is shipped (``PROVIDED``: boto3 and what it pulls in), however it is
pulled in: pip resolves the whole closure (aws-xray-sdk, for Powertools' tracer, requires botocore, which
requires urllib3, jmespath and dateutil), then ``drop_provided`` removes those distributions, file by file
from their RECORD. A layer comes first on ``sys.path``, so a copy there would shadow the runtime's own (and
a function would run two SDKs: Powertools' idempotency imports the runtime's boto3). What is left may only
require the provided packages at versions the runtime has (``RUNTIME_FLOOR``); the build fails otherwise.
"""

from __future__ import annotations

import csv
import email.message
import email.parser
import os
import re
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
PROVIDED = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "urllib3", "python-dateutil", "six"})
"""Distributions the Lambda Python runtime ships itself (normalized names)."""
PROVIDED_MODULES = frozenset({"boto3", "botocore", "s3transfer", "jmespath", "urllib3", "dateutil", "six"})
"""The top-level modules those distributions install."""
RUNTIME_FLOOR = {
    "boto3": "1.34.0",
    "botocore": "1.34.0",
    "s3transfer": "0.10.0",
    "jmespath": "1.0.1",
    "python-dateutil": "2.8.2",
    "urllib3": "1.26.18",
    "six": "1.16.0",
}
"""The oldest version of each provided distribution assumed in the python3.12 runtime. A shipped package that
requires more (or caps it below) fails the build: it would import the runtime's copy at a version it rejects."""


def layer_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The library's dependencies plus its ``lambda`` extra, as pyproject.toml declares them."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["lambda"]]
    return [req for req in wanted if _name(req) not in PROVIDED]


def _name(requirement: str) -> str:
    for stop in "[<>=!~; ":
        requirement = requirement.split(stop, 1)[0]
    return requirement.lower()


def bundle_library(output_dir: Path, requirements: Sequence[str] | None = None) -> None:
    """Write the library layer into ``output_dir/python``: wheels for the Lambda runtime, then ``dormant``."""
    target = output_dir / "python"
    install_for_runtime(target, layer_requirements() if requirements is None else requirements)
    copy_packages(target, [LIBRARY], leave_out=LEFT_OUT)
    compile_for_runtime(target)


def app_requirements(requirements_file: Path | None, extras: Sequence[str] = ()) -> list[str]:
    """What the app layer installs: the lines of the app's requirements file (``-c app_requirements=``), and the
    library's optional dependencies ``extras`` (pyproject.toml) the deployment needs, less what the runtime has."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = [req for extra in extras for req in project["optional-dependencies"][extra]]
    if requirements_file is not None:
        if not requirements_file.is_file():
            raise SystemExit(f"-c app_requirements={requirements_file}: no such file")
        for raw in requirements_file.read_text(encoding="utf-8").splitlines():
            line = raw.split(" #", 1)[0].strip()
            if line.startswith("-"):
                raise SystemExit(f"{requirements_file}: only requirement lines, not pip options ({line!r})")
            if line and not line.startswith("#"):
                wanted.append(line)
    return [req for req in wanted if _name(req) not in PROVIDED]


def install_for_runtime(target: Path, requirements: Sequence[str]) -> None:
    """pip-install ``requirements`` into ``target`` as wheels for the Lambda runtime, less what it provides."""
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
            *requirements,
        ],
        check=True,
        timeout=600,
    )
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts: nothing in a layer runs them
    drop_provided(target)


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _metadata(dist_info: Path) -> email.message.Message:
    return email.parser.Parser().parsestr((dist_info / "METADATA").read_text(encoding="utf-8"), headersonly=True)


def drop_provided(target: Path) -> list[str]:
    """Remove every distribution in ``PROVIDED`` from the pip target ``target`` (each file its RECORD lists,
    then its emptied directories and its dist-info); return their names. Then check what is left requires
    them only at versions the runtime has (``check_provided_requirements``)."""
    dropped = _drop(target, PROVIDED)
    check_provided_requirements(target)
    return dropped


def _drop(target: Path, names: frozenset[str] | set[str]) -> list[str]:
    """Remove the distributions called ``names`` (normalized) from the pip target ``target``; their names."""
    dropped = []
    for dist_info in sorted(target.glob("*.dist-info")):
        name = _canonical(str(_metadata(dist_info)["Name"]))
        if name not in names:
            continue
        directories: set[Path] = set()
        for row in csv.reader((dist_info / "RECORD").read_text(encoding="utf-8").splitlines()):
            path = (target / row[0]).resolve() if row else target
            if not row or not path.is_relative_to(target.resolve()):
                continue  # a file installed outside the target (none for a --target install)
            path.unlink(missing_ok=True)
            directories.update(p for p in path.parents if p.is_relative_to(target.resolve()) and p != target.resolve())
        for directory in sorted(directories, key=lambda p: len(p.parts), reverse=True):
            for cache in directory.glob("__pycache__"):
                shutil.rmtree(cache)
            if directory.exists() and not any(directory.iterdir()):
                directory.rmdir()
        shutil.rmtree(dist_info, ignore_errors=True)
        dropped.append(name)
    return dropped


def drop_closure(target: Path, roots: Sequence[str]) -> list[str]:
    """Remove from ``target`` every distribution ``roots`` (requirements) need, transitively as the installed
    metadata says (extras and markers evaluated for the runtime); their names."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy: pip runs this build anyway
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

    installed = {_canonical(str(_metadata(d)["Name"])): d for d in target.glob("*.dist-info")}
    base = {"python_version": PYTHON_VERSION, "sys_platform": "linux", "platform_machine": "aarch64"}
    base |= {"platform_system": "Linux", "implementation_name": "cpython"}
    todo = [Requirement(r) for r in roots]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = _canonical(requirement.name)
        extras = set(requirement.extras)
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen or name not in installed:
            continue
        seen.add(key)
        for line in _metadata(installed[name]).get_all("Requires-Dist") or []:
            needed = Requirement(line)
            markers = [{**base, "extra": extra} for extra in extras or {""}] + [{**base, "extra": ""}]
            if needed.marker is None or any(needed.marker.evaluate(m) for m in markers):
                todo.append(needed)
    return _drop(target, {key.split("[", 1)[0] for key in seen})


def check_provided_requirements(target: Path) -> None:
    """Raise ``SystemExit`` when a distribution in ``target`` requires a provided one at a version outside
    what the runtime has (``RUNTIME_FLOOR``), or when a provided module is still there."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip's own copy: pip runs this build anyway
        from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

    environment = {"python_version": PYTHON_VERSION, "sys_platform": "linux", "platform_machine": "aarch64"}
    environment |= {"platform_system": "Linux", "implementation_name": "cpython", "extra": ""}
    problems = [f"{name} is in the layer" for name in sorted(PROVIDED_MODULES) if _module_in(target, name)]
    for dist_info in sorted(target.glob("*.dist-info")):
        metadata = _metadata(dist_info)
        for line in metadata.get_all("Requires-Dist") or []:
            requirement = Requirement(line)
            name = _canonical(requirement.name)
            if name not in PROVIDED or (requirement.marker and not requirement.marker.evaluate(environment)):
                continue
            if not requirement.specifier.contains(RUNTIME_FLOOR[name], prereleases=True):
                problems.append(
                    f"{metadata['Name']} requires {line}; the runtime may have {name} {RUNTIME_FLOOR[name]}"
                )
    if problems:
        raise SystemExit("infra.bundle: the layer relies on the runtime's packages it cannot: " + "; ".join(problems))


def _module_in(target: Path, module: str) -> bool:
    return (target / module).exists() or (target / f"{module}.py").exists()


def bundle_app(output_dir: Path, packages: Sequence[Path], requirements: Sequence[str] = ()) -> None:
    """Write the app layer into ``output_dir/python``: the app's requirements as wheels for the runtime (none
    it provides), then the agent app's packages, compiled."""
    if requirements:
        # One resolution with the library's own requirements, so the app's agree with what the library layer
        # ships; then what that layer ships is dropped here: layers unpack into the same /opt/python, and a
        # second copy of a package would overwrite the first file by file.
        install_for_runtime(output_dir / "python", [*layer_requirements(), *requirements])
        drop_closure(output_dir / "python", layer_requirements())
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
