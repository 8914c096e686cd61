"""The Lambda layers: the dormant library with its dependencies, and the agent app's own packages.

Both are bundled locally (no Docker) by the functions of ``infra.bundle``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from .bundle import LIBRARY, app_requirements, bundle_app, bundle_library

RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.ARM_64


@jsii.implements(ILocalBundling)
class _Local:
    """CDK's local bundling hook: build the layer with this interpreter's pip instead of in a container."""

    def __init__(self, build: Callable[[Path], None]) -> None:
        self._build = build

    def try_bundle(self, output_dir: str, *args: Any, **kwargs: Any) -> bool:
        self._build(Path(output_dir))
        return True


def _locally_bundled(source: Path, build: Callable[[Path], None]) -> lambda_.Code:
    return lambda_.Code.from_asset(
        str(source),
        asset_hash_type=AssetHashType.OUTPUT,
        bundling=BundlingOptions(
            # Only used when local bundling is refused, which ours never does.
            image=DockerImage.from_registry("public.ecr.aws/sam/build-python3.12"),
            local=_Local(build),
        ),
    )


class Layers(Construct):
    """``library``: dormant and its dependencies. ``app``: the packages of the agent app the functions serve, with
    the distributions its ``requirements`` file names and the library's ``extras`` the chosen model needs (the
    ``openai`` SDK for ``-c model=openai:...``), fetched for the runtime like the library's."""

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        app_packages: Sequence[Path],
        requirements: Path | None = None,
        extras: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, id)
        self.library = lambda_.LayerVersion(
            self,
            "Library",
            code=_locally_bundled(LIBRARY.parents[1], bundle_library),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="dormant and its dependencies (Python 3.12, arm64)",
        )
        packages = list(app_packages)
        wanted = app_requirements(requirements, extras)
        self.app = lambda_.LayerVersion(
            self,
            "App",
            code=_locally_bundled(packages[0].parent, lambda out: bundle_app(out, packages, wanted)),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description=f"the agent app: {', '.join(p.name for p in packages)}"
            + (f"; with {', '.join(wanted)}" if wanted else ""),
        )
