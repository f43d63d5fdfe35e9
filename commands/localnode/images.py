"""The node's images, built without a container engine and cached by their inputs.

`baton:local` follows the Dockerfile, `baton-tenant:local` (the example tenants' image: the slim
client, none of the daemons' dependencies) follows clients/python/Dockerfile: the project its
build stage pip installs from the COPYed sources goes into a venv at the path it names, on a
Debian bookworm root filesystem made by mmdebstrap (bookworm's python3 is 3.11, like the
Dockerfiles' base), with what it copies into installed packages and its ENV, USER, ENTRYPOINT
and CMD. The dependencies are wheels pip resolves for the project (pip's cache makes a rerun
quick).
"""

from __future__ import annotations

import fnmatch
import hashlib
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from commands.localnode.archive import layer_from_files, write_archive
from commands.localnode.binaries import CHECKOUT, KubeBinaries, cache_dir
from commands.localnode.dockerfile import Dockerfile, parse_dockerfile
from commands.localnode.procs import LocalNodeError, run
from commands.localnode.runtime import PAUSE_IMAGE

BATON_IMAGE = "baton:local"
TENANT_IMAGE = "baton-tenant:local"
DAEMONS_DOCKERFILE = "Dockerfile"
TENANT_DOCKERFILE = "clients/python/Dockerfile"
SCHEDULER_IMAGE = "localhost/kube-scheduler:local"
SUITE = "bookworm"
BUILDER_VERSION = "2"
"""Bump when the build steps change, so cached images are rebuilt."""
PAUSE_C = "#include <signal.h>\n#include <unistd.h>\n#include <sys/wait.h>\n" + (
    "static void reap(int s){(void)s;while(waitpid(-1,0,WNOHANG)>0);}\n"
    "static void quit(int s){(void)s;_exit(0);}\n"
    "int main(void){signal(SIGCHLD,reap);signal(SIGINT,quit);signal(SIGTERM,quit);"
    "for(;;)pause();}\n"
)


def images_dir() -> Path:
    """Where built image archives are kept."""
    return cache_dir() / "images"


def _cached(name: str, key: str) -> Path:
    return images_dir() / f"{name}-{key[:16]}.tar"


def _drop_stale(name: str) -> None:
    """Remove archives of `name` built from other inputs (before writing the current one); those
    of another image whose name starts alike (`baton-tenant` beside `baton`) stay."""
    for stale in images_dir().glob(f"{name}-" + "[0-9a-f]" * 16 + ".tar"):
        stale.unlink()


def pause_image(work: Path) -> Path:
    """The sandbox image: a static pause program that reaps children and exits on a signal."""
    key = hashlib.sha256((PAUSE_C + BUILDER_VERSION).encode()).hexdigest()
    out = _cached("pause", key)
    if out.exists():
        return out
    work.mkdir(parents=True, exist_ok=True)
    (work / "pause.c").write_text(PAUSE_C)
    run(["gcc", "-static", "-Os", "-o", str(work / "pause"), str(work / "pause.c")])
    layer = layer_from_files(work / "pause-layer.tar", {"pause": work / "pause"})
    out.parent.mkdir(parents=True, exist_ok=True)
    _drop_stale("pause")
    return write_archive(out, PAUSE_IMAGE, [layer], {"Entrypoint": ["/pause"]})


def scheduler_image(binaries: KubeBinaries, work: Path) -> Path:
    """kube-scheduler on its own (the binary is static), as the baton-scheduler pod runs it."""
    binary = binaries.kube_scheduler.resolve()
    key = hashlib.sha256(f"{binary}:{binary.stat().st_size}:{BUILDER_VERSION}:resolved".encode())
    out = _cached("kube-scheduler", key.hexdigest())
    if out.exists():
        return out
    work.mkdir(parents=True, exist_ok=True)
    layer = layer_from_files(
        work / "scheduler-layer.tar", {"usr/local/bin/kube-scheduler": binaries.kube_scheduler}
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    _drop_stale("kube-scheduler")
    config = {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin"], "Entrypoint": ["kube-scheduler"]}
    return write_archive(out, SCHEDULER_IMAGE, [layer], config)


def _ignore_patterns(root: Path, dockerfile: str) -> list[str]:
    """Docker's rule: `<Dockerfile>.dockerignore` beside it if there is one, else the context's."""
    beside = root / f"{dockerfile}.dockerignore"
    path = beside if beside.exists() else root / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps `rel` out of the build context (the last match decides)."""
    parents = [rel] + ["/".join(rel.split("/")[:n]) for n in range(1, rel.count("/") + 1)]
    ignored = False
    for pattern in patterns:
        keep = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if glob == "**" or any(fnmatch.fnmatch(p, glob) for p in parents):
            ignored = not keep
    return ignored


def source_files(
    spec: Dockerfile, root: Path = CHECKOUT, dockerfile: str = DAEMONS_DOCKERFILE
) -> list[Path]:
    """Every file the Dockerfile's COPY instructions take from the build context."""
    patterns = _ignore_patterns(root, dockerfile)
    files: list[Path] = []
    for source in spec.copy_sources:
        path = root / source
        if not path.exists():
            raise LocalNodeError(f"{dockerfile} copies {source}, which {root} does not have")
        found = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        files += [p for p in found if not _ignored(str(p.relative_to(root)), patterns)]
    return files


def image_key(spec: Dockerfile, root: Path = CHECKOUT, dockerfile: str = DAEMONS_DOCKERFILE) -> str:
    """Hash of everything an image is built from."""
    digest = hashlib.sha256(f"{BUILDER_VERSION}:{SUITE}:{spec.text}".encode())
    for path in source_files(spec, root, dockerfile):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def baton_image(work: Path, root: Path = CHECKOUT) -> Path:
    """The daemons' image archive (cached by its inputs); built with mmdebstrap when missing."""
    return python_image("baton", BATON_IMAGE, DAEMONS_DOCKERFILE, work, root)


def tenant_image(work: Path, root: Path = CHECKOUT) -> Path:
    """The example tenants' image archive (the slim client), built like `baton_image`."""
    return python_image("baton-tenant", TENANT_IMAGE, TENANT_DOCKERFILE, work, root)


def archive_path(name: str, dockerfile: str, root: Path = CHECKOUT) -> Path:
    """Where the archive of the image built from `dockerfile` as it is now is kept."""
    return _planned(name, dockerfile, root)[1]


def _planned(name: str, dockerfile: str, root: Path) -> tuple[Dockerfile, Path]:
    """The Dockerfile as read, and where the image built from it as it is now is kept."""
    spec = parse_dockerfile((root / dockerfile).read_text())
    return spec, _cached(name, image_key(spec, root, dockerfile))


def python_image(name: str, ref: str, dockerfile: str, work: Path, root: Path = CHECKOUT) -> Path:
    """The image `dockerfile` describes, tagged `ref` (cached by its inputs)."""
    spec, out = _planned(name, dockerfile, root)
    if out.exists():
        return out
    if shutil.which("mmdebstrap") is None:
        raise LocalNodeError(
            f"building the {ref} image needs mmdebstrap: apt-get install mmdebstrap"
        )
    work.mkdir(parents=True, exist_ok=True)
    context = work / "context"
    shutil.rmtree(context, ignore_errors=True)
    for path in source_files(spec, root, dockerfile):
        target = context / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    project = context / spec.project_dir
    wheels = work / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels)]
    run([*pip, f"{project}{spec.extras}"], timeout=600)
    rootfs = work / "rootfs.tar"
    venv = spec.venv
    q = shlex.quote  # host paths may hold spaces; the site-packages glob stays unquoted
    installed = f'"$1"{q(venv)}/lib/python3*/site-packages'
    hooks = [
        f'cp -r {q(str(wheels))} "$1/tmp/wheels"',
        f'chroot "$1" python3 -m venv {q(venv)}',
        f'chroot "$1" {q(venv + "/bin/pip")} install --quiet --no-index --find-links /tmp/wheels'
        f" {q(_project_name(project) + spec.extras)}",
        *(f"cp -r {q(str(context / s))} {installed}/{q(p)}/" for s, p in spec.into_packages),
        'rm -rf "$1/tmp/wheels" "$1/var/cache/apt" "$1/var/lib/apt/lists"',
    ]
    argv = ["mmdebstrap", "--variant=minbase", "--mode=root", "--include=python3,python3-venv"]
    argv += ["--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*"]
    argv += [f"--customize-hook={hook}" for hook in hooks]
    try:
        run([*argv, SUITE, str(rootfs)], timeout=900)
    except subprocess.TimeoutExpired as err:
        raise LocalNodeError(f"mmdebstrap did not finish within {err.timeout} s") from err
    out.parent.mkdir(parents=True, exist_ok=True)
    _drop_stale(name)
    archive = write_archive(out, ref, [rootfs], spec.image_config())
    rootfs.unlink()
    return archive


def _project_name(project: Path) -> str:
    """The distribution's name, from its pyproject.toml."""
    try:
        return str(tomllib.loads((project / "pyproject.toml").read_text())["project"]["name"])
    except (OSError, KeyError, tomllib.TOMLDecodeError) as err:
        raise LocalNodeError(f"{project}/pyproject.toml names no project: {err}") from err
