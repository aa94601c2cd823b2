"""Whether a sample's answer is exact: verification, the rebuild pool and reconstructor that re-derive token ids, model
identification, and quality checks."""
