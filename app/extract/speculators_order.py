"""Where speculators looks for each sample's hidden states: found by token ids in its prepared dataset.

speculators' trainer reads the hidden states of prepared row k from `hs_<k>.safetensors`
(hs_connectors/transfer.py `FileTransfer.get_cached`) and drops a row whose stored `token_ids` differ from the
row's `input_ids` with only a warning (speculators/train/data.py `ArrowDataset._get_raw_data`). `speculators
prepare-data` shuffles the rows (speculators/data_generation/preprocessing.py `load_and_preprocess_dataset`:
`shuffle(seed)` per input and again after concatenating), so export order is not prepared order. The built-in
extractor therefore reads the prepared dataset (`<export>/prepared`, datasets' Arrow files) and writes each
sample's states to every prepared row that holds exactly its ids, whatever the order; a sample with no such row
(cut by prepare-data's `--seq-length`, filtered, or another export's dataset) is refused before any GPU work.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from app.errors import InputError
from app.extract.arrow_stream import IntListColumn, prepared_files

PREPARED_DIR = "prepared"  # `speculators prepare-data --output <export>/prepared`, beside the export's data/


def _key(raw: bytes | memoryview) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def ids_key(input_ids: Sequence[int]) -> bytes:
    """The lookup key of a row's token ids (int64 little-endian bytes, hashed)."""
    return _key(array("q", input_ids).tobytes())


class SpeculatorsOrder:
    """Each wanted sample's prepared row indices (its `hs_<k>` files), found by token ids."""

    def __init__(self, prepared: Path, rows_by_key: dict[bytes, list[int]], total: int) -> None:
        self.prepared = prepared
        self._rows = rows_by_key
        self.total = total  # rows in the prepared dataset

    @classmethod
    def scan(
        cls, prepared: Path, samples: Iterable[tuple[str, Sequence[int]]], *, max_length: int | None = None
    ) -> SpeculatorsOrder:
        """Read `prepared`'s `input_ids` and locate every (sample id, input ids) of `samples`; InputError naming
        the first sample no prepared row holds (and how many), or a `prepared` that is not such a dataset."""
        wanted: dict[bytes, str] = {}
        for sample_id, ids in samples:
            wanted.setdefault(ids_key(ids), sample_id)
        rows: dict[bytes, list[int]] = defaultdict(list)
        k = 0
        for path in prepared_files(prepared):
            column = IntListColumn(path, "input_ids")
            try:
                if column.item_size not in (0, 8):
                    raise InputError(f"{path}: input_ids are {8 * column.item_size}-bit; expected speculators' int64")
                for values in column.rows():
                    key = _key(values)
                    if key in wanted:
                        rows[key].append(k)
                    k += 1
                    del values
            finally:
                column.close()
        missing = [sid for key, sid in wanted.items() if key not in rows]
        if missing:
            cut = f" --seq-length {max_length}" if max_length else " --seq-length at least the longest row"
            raise InputError(
                f"{prepared}: {len(missing)} sample(s) of this export are in no row of the prepared dataset (first: "
                f"{missing[0]!r}); speculators prepare-data cut or dropped them, or it was run on other data. Run "
                f"`speculators prepare-data --data <export>/data --output {prepared} --overwrite{cut}` again, then "
                "extract again"
            )
        return cls(prepared, dict(rows), k)

    def indices(self, input_ids: Sequence[int]) -> list[int]:
        """The prepared rows whose ids are `input_ids` (speculators reads hs_<k> for each); [] when none."""
        return list(self._rows.get(ids_key(input_ids), ()))


def prepared_path(manifest_path: Path, explicit: Path | None) -> Path:
    """The prepared dataset the speculators layout numbers its files by: `explicit`, else `<export>/prepared`;
    InputError with the command that makes it when there is none."""
    path = explicit or Path(manifest_path).parent / PREPARED_DIR
    if not (path / "state.json").exists():
        export = Path(manifest_path).parent
        raise InputError(
            f"{path}: no speculators prepared dataset. speculators reads the hidden states of row k of the dataset "
            "`speculators prepare-data` writes from hs_<k>.safetensors, and prepare-data shuffles the rows, so the "
            f"files are numbered by that dataset: run `speculators prepare-data --model TARGET --data {export}/data "
            f"--output {path} --seq-length LONGEST` first (the export's manifest.json `train` lists it with the "
            "longest row), then extract again"
        )
    return path
