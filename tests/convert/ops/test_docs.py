"""docs/ops.md is generated from the converter registry and kept up to date."""
from tftrt_py.convert.ops import docs, registered_ops

REGENERATE = "python -m tftrt_py.convert.ops.docs"


def test_ops_page_is_up_to_date():
    current = docs.DOCS_PATH.read_text() if docs.DOCS_PATH.exists() else ""
    assert current == docs.render(), f"docs/ops.md is out of date with the converter registry: run `{REGENERATE}`"


def test_every_registered_op_has_a_row_with_constraints():
    rows = {line.split(" | ")[0].strip("| `"): line for line in docs.render().splitlines() if line.startswith("| `")}
    assert sorted(rows) == registered_ops()
    assert all(line.split(" | ")[4] != "—" for line in rows.values()), "a converter has no docstring"


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    stale = tmp_path / "ops.md"
    stale.write_text("old\n")
    assert docs.main(["--check", "--output", str(stale)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert docs.main(["--output", str(stale)]) == 0
    assert docs.main(["--check", "--output", str(stale)]) == 0
