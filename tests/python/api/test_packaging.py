"""Imports, build facts and the newcomer's CLI: `import statecache` loads only
the core; `statecache info`, `statecache bench`; one version; clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import statecache
from statecache import _C
from statecache.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[3]


def _python(code: str, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    pkg = str(Path(statecache.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, pkg, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_import_loads_only_the_core():
    code = (
        "import sys, statecache\n"
        "heavy = ('torch', 'transformers', 'statecache.engine', 'statecache.models', "
        "'statecache.sim', 'statecache.layout', 'statecache.executor', 'statecache.metrics', "
        "'prometheus_client', 'matplotlib')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "print(statecache.engine.Engine.__name__, 'statecache.engine' in sys.modules)\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.splitlines()
    assert first == "[]"
    assert second == "Engine True"  # loads on first use


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        statecache.no_such_thing  # noqa: B018


def test_one_version():
    info = _C.build_info()
    assert info["version"] == statecache.__version__
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text
    assert 'metadata.version.input = "python/statecache/_version.py"' in text
    assert "\nversion =" not in text


def test_build_info_agrees_with_the_module():
    info = _C.build_info()
    assert set(info) >= {
        "version",
        "build_type",
        "gpu_backend",
        "gpu_archs",
        "gpu_note",
        "gpu_request",
        "cxx_compiler",
        "pybind11",
        "sanitized",
    }
    assert (info["gpu_backend"] != "none") == bool(_C.has_gpu_kernels)
    if _C.has_gpu_kernels:
        assert info["gpu_archs"] and not info["gpu_note"]
    else:
        assert info["gpu_archs"] == "" and info["gpu_note"].startswith("STATECACHE_CUDA=")


def test_info_text_and_json(capsys):
    assert cli_main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"statecache         {statecache.__version__}" in out.replace("  ", "  ")
    assert "GPU kernels" in out and "build type" in out and "torch" in out
    assert cli_main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["version"] == statecache.__version__
    assert data["gpu_kernels"] == bool(_C.has_gpu_kernels)
    assert data["build"] == _C.build_info()


def test_python_dash_m_runs_the_cli():
    # the statecache this test imported: the checkout, or the installed package in .ci/run
    env = dict(os.environ, PYTHONPATH=str(Path(statecache.__file__).resolve().parents[1]))
    r = subprocess.run(
        [sys.executable, "-m", "statecache", "info", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["version"] == statecache.__version__


def test_info_says_loudly_when_auto_found_no_toolchain(monkeypatch, capsys):
    from statecache import info

    fake = dict(
        _C.build_info(),
        gpu_backend="none",
        gpu_archs="",
        gpu_request="AUTO",
        gpu_note="STATECACHE_CUDA=AUTO found no CUDA compiler (nvcc): CPU executor only",
    )
    monkeypatch.setattr(_C, "build_info", lambda: fake)
    monkeypatch.setattr(_C, "has_gpu_kernels", False)
    text = info.format_info(info.collect())
    assert "WARNING: built WITHOUT GPU kernels: STATECACHE_CUDA=AUTO found no CUDA compiler" in text


def test_arch_coverage():
    from statecache.info import _arch_coverage

    archs = "80-real,86-real,89-real,90-real,100-real,120-real,120-virtual"
    assert _arch_coverage(archs, 9, 0) == "sm_90: SASS built"
    assert _arch_coverage(archs, 8, 7) == "sm_87: runs the sm_86 SASS"
    assert _arch_coverage(archs, 12, 1) == "sm_121: runs the sm_120 SASS"
    assert "JIT-compiled from compute_120 PTX" in _arch_coverage(archs, 13, 0)
    assert "NOT COVERED" in _arch_coverage("90-real", 8, 0)


def test_cuda_arch_list_in_cmake():
    text = (ROOT / "CMakeLists.txt").read_text()
    for arch in ("80-real", "86-real", "89-real", "90-real", "100-real", "120-real", "120-virtual"):
        assert arch in text
    assert "message(WARNING" in text and "STATECACHE_CUDA=AUTO found no CUDA compiler" in text


def test_pybind11_is_pinned():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"pybind11>=3.0,<3.2"' in text


def _requirements_module():
    """statecache/models/_requirements.py itself: importing it through the
    package would run the package's own check, which raises on a machine
    whose transformers is too old (the behaviour tested below)."""
    import importlib.util

    path = Path(statecache.__file__).parent / "models" / "_requirements.py"
    spec = importlib.util.spec_from_file_location("statecache_models_requirements", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_too_old_transformers_names_the_version(tmp_path):
    req = _requirements_module()
    MIN_TRANSFORMERS, require_transformers = req.MIN_TRANSFORMERS, req.require_transformers

    with pytest.raises(ImportError, match=r"transformers>=5\.24, found 4\.46\.0"):
        require_transformers("4.46.0")
    assert require_transformers("5.24.0") == "5.24.0"
    assert require_transformers("6.0.0.dev0") == "6.0.0.dev0"
    assert f'"transformers>={MIN_TRANSFORMERS}"' in (ROOT / "pyproject.toml").read_text()
    # the demo, with an old transformers first on the path: a message, exit 2
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text('__version__ = "4.46.0"\n')
    meta = tmp_path / "transformers-4.46.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 4.46.0\n")
    r = _python(
        "import sys; from statecache.cli import main; sys.exit(main(['demo']))",
        extra_path=str(tmp_path),
    )
    assert r.returncode == 2, r.stderr
    assert "needs transformers>=5.24, found 4.46.0" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_bench_and_info_as_available(capsys):
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    out = capsys.readouterr().out
    assert "unavailable" not in out
    assert "bench" in out and "info" in out


def test_bench_without_a_checkout(tmp_path, capsys):
    assert cli_main(["bench", "--dir", str(tmp_path)]) == 2
    assert "ship with the source checkout" in capsys.readouterr().err


def test_bench_runs_the_pool_benchmark(capsys):
    # --dir: under CI the package is installed, away from the checkout's benchmarks/
    assert cli_main(["bench", "pools", "--dir", str(ROOT / "benchmarks")]) == 0
    out = capsys.readouterr().out
    assert "== pools" in out
    assert "| statecache " in out and "vs statecache" in out


def test_simulate_plot_axis_names_the_shared_budget():
    from statecache.sim.report import budget_axis_label

    assert budget_axis_label([{"config": {"memory": 2**33}}]) == "memory budget (KV + state, GiB)"
    assert budget_axis_label([{"config": {"memory": None}}]) == "state memory budget (GiB)"
