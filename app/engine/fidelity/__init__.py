"""Whether a sample's answer is exact: the reconstruction pool and the per-endpoint reconstructor that re-derive
token ids (over `app.tokens.Reconstructor`), verification, model identification, and quality checks."""
