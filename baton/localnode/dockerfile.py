"""What the Dockerfile describes, read so the local image build follows it rather than a copy."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from baton.localnode.procs import LocalNodeError

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH of the Debian base image, which the Dockerfile's ENV PATH extends."""
KNOWN = {"ARG", "FROM", "WORKDIR", "COPY", "RUN", "ENV", "USER", "ENTRYPOINT", "CMD"}
PROJECT = "baton-gpu"


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
    project: str = PROJECT
    extras: str = ""
    """No CUDA/NVML bindings: the local node has no GPU (as `--build-arg BATON_EXTRAS=`)."""

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


def parse_dockerfile(text: str) -> Dockerfile:
    """Read COPY sources, the venv, ENV, USER, ENTRYPOINT and CMD; refuse what it cannot follow."""
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
            venv = re.search(r"-m venv (\S+)", rest)
            spec.venv = venv.group(1) if venv else spec.venv
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
    if stages != 2 or not spec.venv or not spec.copy_sources or not spec.entrypoint:
        raise LocalNodeError(
            "the Dockerfile no longer has the shape the local build follows (a build stage that"
            " makes a venv from COPYed sources, a final stage with ENTRYPOINT)"
        )
    return spec
