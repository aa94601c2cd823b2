"""The run record, the engine's lowest floor: the snapshot a face draws, its codec, reads of a stored record, and
per-endpoint metrics. Imports nothing else of the engine."""
