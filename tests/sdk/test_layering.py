"""`whitney` is the SDK layer: importing it must load neither prefect nor torch."""

import subprocess
import sys
from pathlib import Path

import whitney

MODULES = (
    "whitney",
    "whitney.wire",
    "whitney.errors",
    "whitney.losses",
    "whitney.datums",
    "whitney.advantages",
    "whitney.payloads",
    "whitney.client",
    "whitney.hf_cache",
    "whitney.tokenizers",
    "whitney.renderers",
)


def test_importing_the_sdk_loads_neither_prefect_nor_torch():
    code = (
        "import sys\n"
        f"for name in {MODULES!r}:\n"
        "    __import__(name)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('prefect', 'torch'))\n"
        "print(','.join(heavy))\n"
        "print('whitney.client' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    heavy, client_loaded = result.stdout.splitlines()
    assert heavy == ""
    assert client_loaded == "True"


def test_the_package_exports_its_public_names():
    for name in whitney.__all__:
        assert getattr(whitney, name) is not None, name
    assert isinstance(whitney.__version__, str) and whitney.__version__
    assert whitney.WhitneyClient.__module__ == "whitney.client"
    assert whitney.OperationFailed is whitney.errors.OperationFailed


def test_the_embedded_server_and_its_engine_never_load_prefect():
    """Every module of `whitney/local/` (the torch engine included), imported together."""
    root = Path(whitney.__file__).parent
    names = sorted(
        ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        for path in (root / "local").rglob("*.py")
        if path.name != "__main__.py"
    )
    code = (
        "import sys\n"
        f"for name in {names!r}:\n"
        "    __import__(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'prefect'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert "whitney.local.recovery" in names and "whitney.local.engine.runtime" in names
    assert result.stdout.strip() == "[]"
