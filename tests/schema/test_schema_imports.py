"""The schema imports only the standard library: the operator image and ``--help`` rely on it."""

import subprocess
import sys

MODULES = ("args", "config", "parser", "render", "env", "model_info", "help", "reference", "rules")


def test_schema_modules_import_nothing_heavy():
    code = (
        "import sys\n"
        + "".join(f"import infernetes.schema.{m}\n" for m in MODULES)
        + "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'torch', 'numpy', 'transformers', 'yaml', 'kopf', 'kubernetes', 'pydantic', 'fastapi'}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
