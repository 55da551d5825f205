"""`make lint`'s type check hands mypy each file under the module name it is imported by."""

from pathlib import Path

from infernetes import typecheck

ROOT = Path(__file__).resolve().parents[2]


def test_each_folder_is_checked_as_the_package_it_installs_as():
    modules = {
        Path(source.path).resolve().relative_to(ROOT).as_posix(): source.module
        for source in typecheck.module_sources()
    }
    assert modules["runtime/server/api_server.py"] == "infernetes.runtime.server.api_server"
    assert modules["operator/__init__.py"] == "infernetes.operator"
    assert modules["kernels/ops.py"] == "infernetes.kernels.ops"
    assert modules["infernetes/schema/args.py"] == "infernetes.schema.args"
    assert all(module.startswith("infernetes") for module in modules.values())
    assert len(set(modules.values())) == len(modules)
