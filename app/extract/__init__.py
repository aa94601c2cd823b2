"""The built-in EAGLE-3 hidden-state extractor that runs inside a job (`python -m app.extract`).

Importing this package never imports torch: the launcher uses the torch-free parts (disk budget, layer
conventions, done-markers); `app.extract.runner` (the shard loop), `app.extract.model` (loading the target,
hooks, the pre/post-norm last state) and the writers of `app.extract.layouts` (one layout per consumer) need
the `extract` extra. `app.extract.speculators_order` (with `arrow_stream`, a reader of the Arrow files
`speculators prepare-data` writes) finds where speculators reads each sample's states, by token ids.
"""

from __future__ import annotations

from app.extract.disk_budget import check_disk_room, estimate_output_bytes, model_shape
from app.extract.layers import AuxLayers, default_aux_layers, resolve_aux_layers
from app.extract.manifest import Manifest, ShardEntry, ShardSample, read_manifest, read_shard
from app.extract.output import done_marker_path, read_done_marker, shard_data_path, shard_is_complete

__all__ = [
    "AuxLayers",
    "Manifest",
    "ShardEntry",
    "ShardSample",
    "check_disk_room",
    "default_aux_layers",
    "done_marker_path",
    "estimate_output_bytes",
    "model_shape",
    "read_done_marker",
    "read_manifest",
    "read_shard",
    "resolve_aux_layers",
    "shard_data_path",
    "shard_is_complete",
]
