"""The run store: SQLite schema and migrations (`schema`, `db`), the batching writer (`run_store.RunStore`),
read-only queries for the faces (`queries`), packed token ids (`ids`) and the records they exchange
(`records`). Import the submodule you need; this package imports nothing heavy itself."""
