"""The operator's monitor (Textual): `app.tui.app` (the App, `run_tui`, `host_run`, `make_app`), the screens,
`source` (the DataSource protocol the screens read), `db_source` (in-process and attached sources, reading
through `app.store.queries`) and `fetch` (the one way a screen reads off the UI thread)."""
