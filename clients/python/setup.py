"""baton-client: the modules a tenant imports, taken from the repository's tree (../../)."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

TREE = "../.."
"""The repository root, relative to this file (setuptools wants relative, /-separated paths)."""
PACKAGES = ["agent", "agent.client", "agent.wire", "baton", "baton._pb", "baton.contract"]
MODULES = {
    # package -> the modules it ships; a package left out ships all of its own
    "agent": {"__init__"},
    "baton": {"__init__"},
    "baton._pb": {"__init__", "agent_pb2", "agent_pb2_grpc"},
    "baton.contract": {"__init__", "names", "framing", "tasks"},
}


class ClientModules(build_py):
    """Ship only the client's import closure from packages the daemons share."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        found = super().find_package_modules(package, package_dir)
        keep = MODULES.get(package)
        return [m for m in found if keep is None or m[1] in keep]

    def find_data_files(self, package: str, src_dir: str) -> list[str]:
        found = super().find_data_files(package, src_dir)
        keep = MODULES.get(package)
        return [f for f in found if keep is None or Path(f).stem in keep]


setup(
    packages=PACKAGES,
    package_dir={p: "/".join([TREE, *p.split(".")]) for p in PACKAGES},
    cmdclass={"build_py": ClientModules},
)
