"""Generated files are checked in; this fails when one is stale (fix: `make generate`)."""

from infernetes import generate


def test_generated_files_are_up_to_date():
    assert generate.stale() == []


def test_write_all_writes_into_a_fresh_tree(tmp_path):
    written = generate.write_all(tmp_path)
    assert set(written) == set(generate.GENERATORS)
    assert generate.stale(tmp_path) == []
    assert "--max-model-len" in (tmp_path / "docs/reference/serve-arguments.md").read_text()
