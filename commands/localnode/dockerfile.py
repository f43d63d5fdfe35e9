"""What the Dockerfile describes, read so the local image build follows it rather than a copy."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from commands.localnode.procs import LocalNodeError

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH of the Debian base image, which the Dockerfile's ENV PATH extends."""
KNOWN = {"ARG", "FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "ENTRYPOINT", "CMD"}
VENV = re.compile(r"python -m venv (\S+)")
UPGRADE_PIP = re.compile(r"\S+/bin/pip install --no-cache-dir --upgrade pip")
PIP_INSTALL = re.compile(
    r'\S+/bin/pip install --no-cache-dir "(\.[^"$\[]*)(\$\{\w+:\+\[\$\{\w+\}\]\})?"'
)
"""The project the build stage installs, a directory of the build context ("." or "./sub/dir"),
with its extras from a build argument only (the local build leaves them out)."""
COPY_INTO_PACKAGE = re.compile(
    r'cp -r (\S+) "\$\(\S+ -I -c \'import (\w+); print\(\2\.__path__\[0\]\)\'\)/"'
)
"""`cp -r SRC "$(python -I -c 'import PKG; print(PKG.__path__[0])')/"`: files added to a
package."""


@dataclass
class Dockerfile:
    """The parts of the Dockerfile the local build uses."""

    text: str
    copy_sources: list[str] = field(default_factory=list)
    venv: str = ""
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    project_dir: str = ""
    """The build-context directory pip installs ("." for the root's pyproject.toml)."""
    into_packages: list[tuple[str, str]] = field(default_factory=list)
    """`(source, package)`: context directories copied into an installed package's directory."""
    extras: str = ""
    """No extras: no CUDA/NVML bindings or torch, the local node has no GPU (as
    `--build-arg BATON_EXTRAS=` or `CLIENT_EXTRAS=`)."""

    def image_config(self) -> dict[str, object]:
        """The image config fields (docker's `config`) the Dockerfile sets."""
        return {
            "Env": [f"{k}={v}" for k, v in self.env.items()],
            "User": self.user,
            "Entrypoint": self.entrypoint,
            "Cmd": self.cmd,
        }


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _exec_form(rest: str, what: str) -> list[str]:
    try:
        value = json.loads(rest)
    except json.JSONDecodeError as err:
        raise LocalNodeError(f"the Dockerfile's {what} is not in exec (JSON) form: {rest}") from err
    return [str(v) for v in value]


def _run(spec: Dockerfile, command: str) -> None:
    """Follow a RUN's steps; refuse one the local build would not carry out the same way."""
    for step in (s.strip() for s in command.split("&&")):
        if venv := VENV.fullmatch(step):
            spec.venv = venv.group(1)
        elif UPGRADE_PIP.fullmatch(step):
            continue  # the venv's own pip installs the wheels either way
        elif (project := PIP_INSTALL.fullmatch(step)) and not spec.project_dir:
            spec.project_dir = project.group(1).removeprefix("./") or "."
        elif copy := COPY_INTO_PACKAGE.fullmatch(step):
            spec.into_packages.append((copy.group(1), copy.group(2)))
        else:
            raise LocalNodeError(f"the local image build cannot follow this RUN step: {step}")


def parse_dockerfile(text: str) -> Dockerfile:
    """Read COPY sources, the venv and what goes into it, ENV, USER, ENTRYPOINT and CMD; refuse
    what it cannot follow."""
    spec = Dockerfile(text=text)
    stages = 0
    for word, rest in _instructions(text):
        if word not in KNOWN:
            raise LocalNodeError(f"the local image build does not know Dockerfile {word}: {rest}")
        if word == "FROM":
            stages += 1
        elif word == "COPY" and "--from=" not in rest:
            spec.copy_sources += shlex.split(rest)[:-1]
        elif word == "RUN":
            _run(spec, rest)
        elif word == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                spec.env[key] = value.replace("$PATH", BASE_PATH)
        elif word == "USER":
            spec.user = rest
        elif word == "ENTRYPOINT":
            spec.entrypoint = _exec_form(rest, word)
        elif word == "CMD":
            spec.cmd = _exec_form(rest, word)
    if (
        stages != 2
        or not (spec.venv and spec.copy_sources and spec.project_dir)
        or not (spec.entrypoint or spec.cmd)
    ):
        raise LocalNodeError(
            "the Dockerfile no longer has the shape the local build follows (a build stage that"
            " makes a venv and pip installs a project from COPYed sources, a final stage with"
            " ENTRYPOINT or CMD)"
        )
    return spec
