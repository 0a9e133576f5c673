"""The built wheel installs one top-level package, `mnemoflow`, nothing an app could collide with.

The wheel is built from a copy of the sources (as the image build does, so setuptools' build files
stay out of the work tree) and installed without dependencies into a fresh virtual environment.
An application with its own `models.py` and `worker.py` then imports both its modules and
mnemoflow's; the dependencies come from the project's environment, appended after the app's path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("models", "memory", "workflows", "activities", "worker", "ops", "devstack", "middleware")


def _site_packages(venv: Path) -> Path:
    found = list((venv / "lib").glob("python3*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def _pip_install(wheel: Path, *where: str) -> None:
    # --target never touches the running environment (--prefix would uninstall the project's
    # own editable install of mnemoflow first).
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q"]
    done = subprocess.run([*cmd, *where, str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for part in ("mnemoflow", *ROOMS):
        shutil.copytree(
            ROOT / part, src / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = dist.glob("mnemoflow-*.whl")
    return found


@pytest.mark.timeout(600)
def test_wheel_installs_only_the_mnemoflow_package(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = _site_packages(venv)
    before = {p.name for p in site.iterdir()}
    _pip_install(wheel, "--target", str(site))
    added = {p.name for p in site.iterdir()} - before
    # --target puts the console script in site/bin; it is the only thing there
    assert sorted(p.name for p in (site / "bin").iterdir()) == ["mnemoflow"]
    added.discard("bin")
    assert {n for n in added if not n.endswith(".dist-info")} == {"mnemoflow"}, added
    assert len([n for n in added if n.endswith(".dist-info")]) == 1, added
    # every room is a real directory inside the package (no symlinks left to dangle)
    for room in ROOMS:
        assert (site / "mnemoflow" / room / "__init__.py").is_file(), room
        assert not (site / "mnemoflow" / room).is_symlink(), room
    # the console script names the namespaced entry point
    entry = next(site.glob("mnemoflow-*.dist-info")) / "entry_points.txt"
    assert "mnemoflow.ops.cli:main" in entry.read_text()


@pytest.mark.timeout(600)
def test_an_app_with_its_own_models_and_worker_imports_both(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _pip_install(wheel, "--target", str(target))
    app = tmp_path / "app"
    app.mkdir()
    (app / "models.py").write_text("WHO = 'the app models'\n")
    (app / "worker.py").write_text("WHO = 'the app worker'\n")
    (app / "main.py").write_text(
        textwrap.dedent(
            """
            import models, worker
            import mnemoflow
            from mnemoflow import MemoryConfig
            from mnemoflow.models.ids import user_workflow_id
            from mnemoflow.worker.settings import Settings

            assert models.WHO == "the app models", models.__file__
            assert worker.WHO == "the app worker", worker.__file__
            assert mnemoflow.__file__.startswith(TARGET), mnemoflow.__file__
            assert MemoryConfig().top_k >= 1
            assert user_workflow_id("alice").startswith("mnemoflow-user-")
            assert Settings is not None
            print("ok")
            """
        ).replace("TARGET", repr(str(target)))
    )
    # The app's folder first, then the wheel's install, then the project's dependencies (its
    # site-packages directory holds no `models`/`worker` packages of ours: the editable install
    # only maps `mnemoflow`, and the wheel's copy comes first).
    deps = sysconfig.get_paths()["purelib"]
    env = {"PYTHONPATH": f"{target}:{deps}", "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        # -S: no site processing, so the project's editable install is not on the path
        [sys.executable, "-S", "-B", str(app / "main.py")],
        capture_output=True,
        text=True,
        cwd=app,
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "ok"
