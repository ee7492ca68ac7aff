"""The operator and CPU predictor images, built here without any registry, cached by a hash of their inputs.

Each image is one layer: a Debian root filesystem made by ``mmdebstrap`` (the suite and apt sources this machine
is configured with) with Python from Debian's packages, our distribution built as a wheel from the working tree and
installed with its dependencies from PyPI (``uv``, at the versions the project's environment holds, as is the
wheel's build backend), console scripts in /usr/local/bin, bytecode compiled once, and the unprivileged user the
chart's securityContext runs as. What goes in and how the image runs (the sources copied, ``ENV``, ``USER``,
``WORKDIR``, ``EXPOSE``, ``ENTRYPOINT``, ``CMD``) is read from the image's Dockerfile in docker/, so the registry
build and this one cannot drift apart. The result is an OCI image archive (``oci-archive``) that
``ctr -n k8s.io images import`` takes, named ``localhost/clef-serving/<image>:<tag>``.

Builds are reproducible: ``SOURCE_DATE_EPOCH`` is fixed, mmdebstrap writes the layer sorted, with numeric owners and
every mtime clamped to it, bytecode is hash-based, nothing records this machine's paths (the console scripts'
shebang is the image's Python), and the archive's own JSON and tar headers carry no build time. The tag is the
distribution's version and a hash of every input (:func:`image_key`); a build whose archive exists is a no-op.
docs/container-images.md has the design, the sizes and the build times.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clef_cluster import oci
from clef_cluster.versions import cache_root

REPO = Path(__file__).resolve().parent.parent
DOCKER_DIR = REPO / "docker"
REGISTRY = "localhost/clef-serving"
# 2026-01-01T00:00:00Z: every timestamp in an image (file mtimes, the config's `created`).
SOURCE_DATE_EPOCH = 1767225600
SUITE = "bookworm"
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"  # Debian's python3.11 reads installs from here
SCRIPTS_DIR = "/usr/local/bin"  # where the distributions' console scripts go, as a `pip install` there puts them
IMAGE_PYTHON = "/usr/bin/python3"  # Debian's interpreter: the scripts' shebang
PYTHON_VERSION = "3.11"
PYTHON_PLATFORM = "x86_64-manylinux_2_36"  # bookworm's glibc
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
# The distributions whose versions come from the working tree, not from the environment's pins.
OWN_DISTRIBUTIONS = frozenset({"clef-serving", "clef-serving-operator"})
# Archives kept per image: the current inputs' and those of other checkouts or branches used lately.
KEPT_ARCHIVES = 2
# Written by the installer for a wheel installed from a path: the path, and the installer's cache time.
INSTALL_RECORDS = ("direct_url.json", "uv_cache.json")


class ImageBuildError(RuntimeError):
    """A step of an image build failed; the message names it."""


@dataclass(frozen=True)
class ImageSpec:
    """One image: its Dockerfile (sources and runtime settings), the distribution it installs, Debian packages."""

    name: str
    dockerfile: str  # in docker/
    project: str  # the Dockerfile's COPY destination holding pyproject.toml
    extras: tuple[str, ...]
    debian_packages: tuple[str, ...]


OPERATOR = ImageSpec(
    name="clef-operator",
    dockerfile="operator.Dockerfile",
    project="/tmp/clef-serving-operator",
    extras=(),
    debian_packages=("python3", "python-is-python3"),
)
# The CPU predictor: the transformers engine (`--engine auto` picks it where vLLM is absent). No vLLM: see
# docs/container-images.md for the size and start time that decided it.
PREDICTOR_CPU = ImageSpec(
    name="clef-predictor-cpu",
    dockerfile="predictor.Dockerfile",
    project="/tmp/clef-serving",
    extras=("serve",),
    debian_packages=("python3", "python-is-python3"),
)
IMAGES: dict[str, ImageSpec] = {spec.name: spec for spec in (OPERATOR, PREDICTOR_CPU)}


@dataclass(frozen=True)
class Runtime:
    """What the Dockerfile says about running the image, and the sources it copies (source, destination)."""

    copies: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    user: str
    home: str | None
    workdir: str
    exposed: tuple[str, ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]


@dataclass(frozen=True)
class BuiltImage:
    """Where an image's archive is (or will be) and the reference it is imported under."""

    name: str
    repository: str  # localhost/clef-serving/<name>: the chart's `image.repository`
    tag: str  # <version>-<input hash>: the chart's `image.tag`
    archive: Path  # an oci-archive tar

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"


def dockerfile_runtime(dockerfile: Path) -> Runtime:
    """COPY, ENV, USER, WORKDIR, EXPOSE, ENTRYPOINT and CMD of a Dockerfile (continuations joined, exec forms)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    copies: list[tuple[str, str]] = []
    env: dict[str, str] = {}
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "COPY":
            *sources, destination = shlex.split(args)
            copies += [(source, destination) for source in sources]
        elif instruction == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
        elif instruction in ("USER", "WORKDIR", "EXPOSE", "ENTRYPOINT", "CMD"):
            found[instruction] = args.strip()
    return Runtime(
        copies=tuple(copies),
        env=tuple(env.items()),
        user=found["USER"],
        home=env.get("HOME"),
        workdir=found["WORKDIR"],
        exposed=tuple(found.get("EXPOSE", "").split()),
        entrypoint=tuple(json.loads(found["ENTRYPOINT"])),
        cmd=tuple(json.loads(found["CMD"])) if "CMD" in found else (),
    )


def source_files(runtime: Runtime) -> list[tuple[Path, str]]:
    """Every file the Dockerfile's COPY instructions bring in: (path here, path in the build), sorted."""
    files: list[tuple[Path, str]] = []
    for source, destination in runtime.copies:
        path = REPO / source
        if path.is_dir():
            for item in sorted(path.rglob("*")):
                relative = item.relative_to(path)
                if item.is_file() and not _ignored(relative):
                    files.append((item, f"{destination.rstrip('/')}/{relative.as_posix()}"))
        elif path.is_file():
            files.append((path, f"{destination.rstrip('/')}/{path.name}"))
        else:
            raise ImageBuildError(f"{source}, copied by the Dockerfile, does not exist")
    return sorted(files, key=lambda item: item[1])


def _ignored(relative: Path) -> bool:
    """Build leftovers the Dockerfiles' .dockerignore keeps out too."""
    return any(part == "__pycache__" or part.endswith(".egg-info") for part in relative.parts) or (
        relative.suffix == ".pyc"
    )


def apt_sources() -> list[Path]:
    """This machine's apt source files (one-line and deb822), as apt reads them."""
    single, folder = APT_SOURCES
    files = [single] if single.is_file() and _has_entries(single) else []
    if folder.is_dir():
        files += sorted(p for p in folder.iterdir() if p.suffix in (".list", ".sources") and _has_entries(p))
    if not files:
        raise ImageBuildError("no apt sources configured on this machine (/etc/apt/sources.list{,.d})")
    return files


def _has_entries(path: Path) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in path.read_text().splitlines())


def pins() -> list[str]:
    """``name==version`` of every distribution installed in the running environment (the project's .venv) but our
    own: the images install the versions the tests ran with.

    Only the environment's site-packages are read, not the whole ``sys.path``: a process that imported
    ``pkg_resources`` also has setuptools' vendored distributions on it (another typing-extensions, for one), and the
    pins, and so the image's key, must not depend on which process asks."""
    site = sorted({sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")})
    found = {
        _normalize(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions(path=site)
        if dist.metadata["Name"] and _normalize(dist.metadata["Name"]) not in OWN_DISTRIBUTIONS
    }
    return [f"{name}=={version}" for name, version in sorted(found.items())]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_key(spec: ImageSpec) -> str:
    """A hash of everything that decides the image: its sources, Dockerfile, this build code and the archive
    writer's, the Debian packages and apt sources, and the pinned PyPI versions."""
    runtime = dockerfile_runtime(DOCKER_DIR / spec.dockerfile)
    digest = hashlib.sha256(repr((spec, SOURCE_DATE_EPOCH, SUITE, pins())).encode())
    for path in (DOCKER_DIR / spec.dockerfile, Path(__file__), Path(oci.__file__), *apt_sources()):
        digest.update(path.read_bytes())
    for path, destination in source_files(runtime):
        digest.update(destination.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _version(spec: ImageSpec) -> str:
    """The version of the distribution the image installs (its pyproject.toml, as the Dockerfile copies it)."""
    runtime = dockerfile_runtime(DOCKER_DIR / spec.dockerfile)
    wanted = f"{spec.project}/pyproject.toml"
    (pyproject,) = [path for path, destination in source_files(runtime) if destination == wanted]
    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def images_dir() -> Path:
    return cache_root() / "images"


def built_image(name: str) -> BuiltImage:
    """Where image ``name`` (a key of :data:`IMAGES`) is cached for the current inputs; built or not."""
    spec = IMAGES[name]
    key = image_key(spec)
    return BuiltImage(
        name=name,
        repository=f"{REGISTRY}/{name}",
        tag=f"{_version(spec)}-{key}",
        archive=images_dir() / name / key / f"{name}.oci.tar",
    )


def build(name: str, log: bool = True) -> BuiltImage:
    """Build image ``name`` unless its archive for the current inputs exists; return it. The image's archives of
    other inputs are kept while they are among the :data:`KEPT_ARCHIVES` last used (other checkouts on the
    machine may be using them), older ones are removed."""
    image = built_image(name)
    with _lock(images_dir() / f"{name}.lock"):
        if image.archive.is_file():
            os.utime(image.archive.parent)  # used now
            return image
        started = time.monotonic()
        _say(log, f"building {image.reference} (once for these inputs)")
        folder = image.archive.parent
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            _build_archive(IMAGES[name], image, folder, log)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        remove_unused_archives(folder.parent, KEPT_ARCHIVES)
        _say(log, f"built {image.reference} in {time.monotonic() - started:.0f} s: {image.archive}")
    return image


def remove_unused_archives(image_dir: Path, keep: int) -> None:
    """Keep the ``keep`` archive folders of ``image_dir`` used last (a folder's mtime is its last use); remove the
    others, and any folder without an archive (a build that was killed)."""
    built = sorted(
        (folder for folder in image_dir.iterdir() if folder.is_dir() and any(folder.glob("*.oci.tar"))),
        key=lambda folder: folder.stat().st_mtime_ns,
        reverse=True,
    )
    for folder in image_dir.iterdir():
        if folder.is_dir() and folder not in built[:keep]:
            shutil.rmtree(folder)


def build_all(log: bool = True) -> dict[str, BuiltImage]:
    """Every image of :data:`IMAGES`, built where missing."""
    return {name: build(name, log=log) for name in IMAGES}


def _build_archive(spec: ImageSpec, image: BuiltImage, folder: Path, log: bool) -> None:
    runtime = dockerfile_runtime(DOCKER_DIR / spec.dockerfile)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=folder))
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH), "TMPDIR": str(work), "UV_NO_CONFIG": "1"}
    try:
        for path, destination in source_files(runtime):
            target = work / "src" / destination.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        # The environment's versions, for the wheel's build backend as for what the image installs.
        constraints = work / "constraints.txt"
        constraints.write_text("\n".join(pins()) + "\n")
        _say(log, f"{spec.name}: building the wheel of {spec.project}")
        wheels = work / "wheels"
        source = work / "src" / spec.project.lstrip("/")
        build_wheel = [_uv(), "build", "--wheel", "--build-constraints", str(constraints), "--out-dir", str(wheels)]
        _run([*build_wheel, str(source)], env)
        (wheel,) = wheels.glob("*.whl")
        requirement = f"{wheel}[{','.join(spec.extras)}]" if spec.extras else str(wheel)
        site = work / "site-packages"
        _say(log, f"{spec.name}: installing the wheel and its dependencies (the environment's versions)")
        _run(
            [
                _uv(), "pip", "install", "--quiet", "--no-config", "--link-mode=copy", "--no-compile-bytecode",
                f"--python={sys.executable}",  # else uv picks one by the working directory
                f"--python-version={PYTHON_VERSION}", f"--python-platform={PYTHON_PLATFORM}",
                "--constraint", str(constraints), "--target", str(site), requirement,
            ],
            env,
        )  # fmt: skip
        drop_install_records(site)
        scripts = work / "scripts"
        relocate_scripts(site, scripts)
        # A file this Python cannot compile (another version's test module) cannot be imported either, so
        # compile_dir's verdict on such files is not the build's (as in docker/predictor.Dockerfile).
        compile_all = [
            "chroot", '"$1"', "python3", "-c",
            f"import compileall, py_compile; compileall.compile_dir({SITE_PACKAGES!r}, quiet=2, workers=0,"
            " invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)",
        ]  # fmt: skip
        hooks = [
            # python3's postinst makes an empty dist-packages: ours replaces it (a rename: one filesystem).
            f'mkdir -p "$1"{SITE_PACKAGES} && rmdir "$1"{SITE_PACKAGES} && mv {_quote(str(site))} "$1"{SITE_PACKAGES}',
            f'mv {_quote(str(scripts))}/* "$1"{SCRIPTS_DIR}/',
            # Hash-based bytecode: the sources' mtimes are clamped in the layer, and the root filesystem is
            # read-only at run time, so timestamped bytecode would be stale and never rewritten.
            " ".join(_quote(arg) for arg in compile_all),
            _useradd(runtime),
            'rm -f "$1/etc/resolv.conf"',
            'echo clef > "$1/etc/hostname"',
        ]
        layer = work / "layer.tar"
        command = [
            "mmdebstrap", "--mode=root", "--variant=minbase", "--format=tar", "--quiet",
            f"--include={','.join(spec.debian_packages)}",
            "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
            *(f"--customize-hook={hook}" for hook in hooks),
            SUITE, str(layer), *map(str, apt_sources()),
        ]  # fmt: skip
        _say(log, f"{spec.name}: mmdebstrap {SUITE} + {', '.join(spec.debian_packages)} + the wheel and its deps")
        _run(command, env)
        _say(log, f"{spec.name}: writing the OCI archive")
        oci.write_archive(image.archive, image.reference, image_config(runtime), layer, mtime=SOURCE_DATE_EPOCH)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def drop_install_records(site: Path) -> None:
    """Remove what records where and when a distribution was installed from (the wheel's build folder, the
    installer's cache time: ``INSTALL_RECORDS``) from every ``*.dist-info`` under ``site``, and from its RECORD."""
    for dist_info in site.glob("*.dist-info"):
        found = [name for name in INSTALL_RECORDS if (dist_info / name).is_file()]
        if not found:
            continue
        for name in found:
            (dist_info / name).unlink()
        record = dist_info / "RECORD"
        dropped = tuple(f"{dist_info.name}/{name}," for name in found)
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith(dropped)))


def relocate_scripts(site: Path, scripts: Path) -> None:
    """Move the console scripts the installer wrote to ``site/bin`` (``--target``'s layout) to ``scripts``, which
    becomes :data:`SCRIPTS_DIR`, with the image's interpreter as their shebang in place of this machine's (which
    would make the image depend on where it was built), and update the distributions' RECORDs to match, as
    ``pip install`` into ``/usr/local`` records them."""
    scripts.mkdir()
    moved: dict[str, str] = {}
    for script in sorted((site / "bin").iterdir()):
        body = b"#!" + IMAGE_PYTHON.encode() + b"\n" + _script_body(script)
        (scripts / script.name).write_bytes(body)
        (scripts / script.name).chmod(0o755)
        digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
        installed = f"{os.path.relpath(SCRIPTS_DIR, SITE_PACKAGES)}/{script.name}"
        moved[f"bin/{script.name}"] = f"{installed},sha256={digest},{len(body)}"
        script.unlink()
    (site / "bin").rmdir()
    for record in site.glob("*.dist-info/RECORD"):
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(_moved_line(line, moved) for line in lines))


def _script_body(script: Path) -> bytes:
    """A console script less its launcher: the ``#!<python>`` line, or the ``/bin/sh`` prologue that installers
    write when the interpreter's path is too long or has spaces for a shebang."""
    first, _, rest = script.read_bytes().partition(b"\n")
    if first == b"#!/bin/sh" and rest.startswith(b"'''exec' "):
        prologue, found, body = rest.partition(b"\n' '''\n")
        if found and b"\n" not in prologue:
            return body
    elif first.startswith(b"#!") and b"python" in first:
        return rest
    raise ImageBuildError(f"{script.name}: not a Python console script (first line {first[:80]!r})")


def _moved_line(line: str, moved: dict[str, str]) -> str:
    path = line.partition(",")[0]
    return moved[path] + "\n" if path in moved else line


def _useradd(runtime: Runtime) -> str:
    uid, _, gid = runtime.user.partition(":")
    home = ["--create-home", "--home-dir", runtime.home] if runtime.home else ["--no-create-home"]
    groupadd = ["chroot", '"$1"', "groupadd", "--gid", gid or uid, "clef"]
    useradd = ["chroot", '"$1"', "useradd", "--uid", uid, "--gid", gid or uid, *home, "--shell", "/usr/sbin/nologin"]
    return " && ".join([" ".join(groupadd), " ".join([*useradd, "clef"])])


def _quote(arg: str) -> str:
    """Shell-quote ``arg``, keeping a ``"$1"`` (the hook's root filesystem) expandable."""
    if arg.startswith('"$1"'):
        return '"$1"' + shlex.quote(arg[4:])
    return shlex.quote(arg)


def _uv() -> str:
    uv = Path(sys.executable).parent / "uv"
    if not uv.is_file():
        raise ImageBuildError(f"uv not found beside {sys.executable} (scripts/bootstrap.sh installs it)")
    return str(uv)


def _run(command: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-4000:]
        raise ImageBuildError(f"{command[0]} {command[1]} failed ({done.returncode}):\n{tail}")


def image_config(runtime: Runtime) -> dict[str, Any]:
    """The OCI image configuration, less its layer (:func:`clef_cluster.oci.write_archive` adds it): the
    Dockerfile's runtime settings."""
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(SOURCE_DATE_EPOCH))
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **dict(runtime.env)}
    config: dict[str, Any] = {
        "User": runtime.user,
        "Env": [f"{key}={value}" for key, value in env.items()],
        "Entrypoint": list(runtime.entrypoint),
        "WorkingDir": runtime.workdir,
        "ExposedPorts": {(port if "/" in port else f"{port}/tcp"): {} for port in runtime.exposed},
    }
    if runtime.cmd:
        config["Cmd"] = list(runtime.cmd)
    return {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "history": [{"created": created, "created_by": f"clef_cluster.images (mmdebstrap {SUITE})"}],
    }


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """One build of an image at a time, across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _say(log: bool, message: str) -> None:
    if log:
        print(f"[clef-images] {message}", file=sys.stderr, flush=True)
