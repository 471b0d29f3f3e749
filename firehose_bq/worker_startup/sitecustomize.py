"""Imported by Python at start-up in Spark's Python worker processes, and only there: `spark.py` puts
this directory on their PYTHONPATH (spark.executorEnv.PYTHONPATH). It must never fail, and it changes
nothing unless the one case below is certain.

Spark puts $SPARK_HOME/python/lib/pyspark.zip first on every worker's PYTHONPATH. Python keeps no
bytecode for modules imported from a zip, so each new worker process compiles pyspark from source
again: 0.4-0.9 s here, paid by every streaming query, since Spark starts a fresh source-runner
process per query for a Python data source. When that zip is the one shipped *inside* the pyspark
package this interpreter has installed (a `pip install pyspark` SPARK_HOME, as in local mode or a
cluster whose executors run from the same install or venv), both are the same release from one
wheel, so the zip moves to the end of sys.path and pyspark is imported from the installed, compiled
files instead. A Spark distribution with its own SPARK_HOME (/opt/spark, YARN, Kubernetes images)
ships a zip elsewhere, which may differ from what pip installed: it stays first, as Spark intends;
so it does when anything else on the path (another zip, a source tree) would supply pyspark instead.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys


def prefer_installed_pyspark(path: list[str]) -> None:
    """Move Spark's pyspark.zip to the end of `path` when the pyspark that is then imported instead is an
    installed package that ships that very zip."""
    for entry in [e for e in path if os.path.basename(e) == "pyspark.zip"]:
        rest = [e for e in path if e != entry]
        # Exactly what the import system would find without the zip (another zip, a source tree, ...).
        spec = importlib.machinery.PathFinder.find_spec("pyspark", rest)
        if spec is None or spec.origin is None:
            continue
        shipped = os.path.join(os.path.dirname(spec.origin), "python", "lib", "pyspark.zip")
        if os.path.realpath(entry) == os.path.realpath(shipped):
            path[:] = [*rest, entry]


def _run_next_sitecustomize() -> None:
    """This module shadows any other `sitecustomize` (a distribution's or the user's): run that one too."""
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    rest = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # run by Python's start-up, not imported by a test
    try:
        prefer_installed_pyspark(sys.path)
    except Exception:  # noqa: BLE001 - start-up must go on exactly as Spark set it up
        pass
    _run_next_sitecustomize()
