"""The worker start-up hook: when it moves Spark's pyspark.zip out of the way, and when it must not."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark

from firehose_bq.spark import WORKER_STARTUP, add_worker_env, worker_pythonpath

HOOK = WORKER_STARTUP / "sitecustomize.py"
INSTALLED = Path(pyspark.__file__).parent
SPARK_ZIP = INSTALLED / "python" / "lib" / "pyspark.zip"


def hook_module():  # noqa: ANN201
    # Under another name: as `sitecustomize` it would act on this process.
    spec = importlib.util.spec_from_file_location("worker_startup_under_test", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_install(root: Path) -> tuple[str, str]:
    """(site directory with a pyspark package, the pyspark.zip that package ships)."""
    package = root / "site" / "pyspark"
    (package / "python" / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "python" / "lib" / "pyspark.zip").write_bytes(b"")
    return str(root / "site"), str(package / "python" / "lib" / "pyspark.zip")


def test_the_zip_inside_the_installed_package_moves_behind_it(tmp_path: Path) -> None:
    site, zipped = fake_install(tmp_path)
    path = [zipped, "/x/py4j-src.zip", str(WORKER_STARTUP), "/usr/lib/python3.11", site]
    hook_module().prefer_installed_pyspark(path)
    assert path == ["/x/py4j-src.zip", str(WORKER_STARTUP), "/usr/lib/python3.11", site, zipped]


def test_a_zip_stays_first_unless_the_installed_package_that_ships_it_would_be_imported(tmp_path: Path) -> None:
    site, zipped = fake_install(tmp_path)
    elsewhere = str(tmp_path / "opt" / "spark" / "python" / "lib" / "pyspark.zip")  # a Spark distribution's
    other = tmp_path / "deps.zip"  # a user's zip holding some pyspark
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("pyspark/__init__.py", "")
    for path in ([elsewhere, site], [elsewhere, "/usr/lib/python3.11"], [zipped, str(other), site]):
        before = list(path)
        hook_module().prefer_installed_pyspark(path)
        assert path == before


def test_a_worker_started_the_way_spark_starts_it_imports_the_installed_pyspark(tmp_path: Path) -> None:
    """PYTHONPATH as Spark's PythonWorkerFactory builds it: its zips, then spark.executorEnv.PYTHONPATH.
    Another sitecustomize further down the path still runs."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE'] = 'ran'\n")
    py4j = next((INSTALLED / "python" / "lib").glob("py4j-*.zip"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SPARK_ZIP), str(py4j), worker_pythonpath(str(user))])}
    out = subprocess.run(
        [sys.executable, "-c", "import os, pyspark; print(pyspark.__file__); print(os.environ.get('USER_SITECUSTOMIZE'))"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out == [str(INSTALLED / "__init__.py"), "ran"]


def test_worker_pythonpath_puts_the_hook_first_and_keeps_what_was_given() -> None:
    assert worker_pythonpath() == str(WORKER_STARTUP)
    assert worker_pythonpath(f"/a{os.pathsep}/b") == os.pathsep.join([str(WORKER_STARTUP), "/a", "/b"])
    assert worker_pythonpath(worker_pythonpath("/a")) == os.pathsep.join([str(WORKER_STARTUP), "/a"])


def test_worker_env_is_added_unless_the_user_set_it_for_the_workers_or_their_parent() -> None:
    environment = {"MALLOC_ARENA_MAX": "2"}
    add_worker_env(environment, {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_ARENA_MAX": "4", "X": "1"}, {"X": "7"})
    assert environment == {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "1048576"}
