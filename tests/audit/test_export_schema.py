"""Issue 23 item 9: the audit export follows the store's schema. Every table and column of
`coordinator_svc.store.schema` is either written by the export (`snapshot.exported_columns`: the
tables written as stored, and what the derived tables carry) or withheld on purpose, with a
reason, in one place (`source.WITHHELD`). A column a migration adds and nobody accounts for
fails here. No Spark: this reads declarations only."""

from __future__ import annotations

from audit_export import snapshot, source
from coordinator_svc.store import schema


def _stored() -> dict[str, set[str]]:
    return {
        name: {column.name for column in table.columns}
        for name, table in schema.Base.metadata.tables.items()
    }


def _withheld(table: str, column: str) -> bool:
    return (table, column) in source.WITHHELD or (table, "*") in source.WITHHELD


def test_every_stored_column_is_exported_or_withheld_with_a_reason() -> None:
    exported = snapshot.exported_columns()
    unaccounted = sorted(
        f"{table}.{column}"
        for table, columns in _stored().items()
        for column in columns
        if column not in exported.get(table, set()) and not _withheld(table, column)
    )
    assert not unaccounted, (
        "stored columns neither exported nor in audit_export.source.WITHHELD: "
        + ", ".join(unaccounted)
    )


def test_withheld_entries_are_real_justified_and_not_exported() -> None:
    stored = _stored()
    exported = snapshot.exported_columns()
    for (table, column), reason in source.WITHHELD.items():
        assert table in stored, f"WITHHELD names {table!r}, which the schema does not have"
        assert column == "*" or column in stored[table], f"no column {table}.{column}"
        assert len(reason) > 20, f"{table}.{column}: say why it is withheld"
        carried = exported.get(table, set())
        assert not (carried if column == "*" else carried & {column}), (
            f"{table}.{column} is both withheld and exported"
        )
    # The exported tables name only columns that exist (a typo would read nothing).
    for table, columns in exported.items():
        assert columns <= stored.get(table, set()), f"{table}: {columns - stored.get(table, set())}"


def test_the_secrets_and_config_values_are_withheld() -> None:
    exported = snapshot.exported_columns()
    assert "coordinator_secrets" not in exported
    assert "config" not in exported["connectors"]
    assert "config" in snapshot.exported_columns(include_config_values=True)["connectors"]
