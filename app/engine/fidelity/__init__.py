"""Whether a sample's answer is exact: verification, the reconstruction pool and reconstructor that re-derive token ids,
model
identification, and quality checks."""
