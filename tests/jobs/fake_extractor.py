"""A stand-in extractor for the job tests: speaks the progress protocol and writes the done-marker.

Usage: fake_extractor.py --shard I --out DIR --ctl DIR [--items N] [--fail I] [--exit-after-marker I]
                         [--ignore-term] [--no-marker]
Blocks while `<ctl>/hold_all` or `<ctl>/hold_<shard>` exists (after its first progress line), so tests
gate shards with files instead of sleeps. Writes `<out>/shard_<i>.env` with its CUDA_VISIBLE_DEVICES.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--shard", type=int, required=True)
p.add_argument("--out", type=Path, required=True)
p.add_argument("--ctl", type=Path, required=True)
p.add_argument("--items", type=int, default=3)
p.add_argument("--fail", type=int, action="append", default=[])
p.add_argument("--exit-after-marker", type=int, action="append", default=[])
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--no-marker", action="store_true")
a = p.parse_args()
if a.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def emit(**obj):
    print(json.dumps(obj), flush=True)


a.out.mkdir(parents=True, exist_ok=True)
(a.out / f"shard_{a.shard}.env").write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"))
print("some library noise on stdout", flush=True)
emit(event="progress", shard=a.shard, done=1, total=a.items, tokens=10)
while (a.ctl / "hold_all").exists() or (a.ctl / f"hold_{a.shard}").exists():
    time.sleep(0.02)
if a.shard in a.fail:
    print(f"fake extractor: shard {a.shard} failed on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
for n in range(2, a.items + 1):
    emit(event="progress", shard=a.shard, done=n, total=a.items, tokens=10 * n)
path = a.out / f"shard_{a.shard}.safetensors"
path.write_bytes(b"x")
emit(event="shard_done", shard=a.shard, path=str(path))
if not a.no_marker:
    (a.out / f"shard_{a.shard}.done").write_text("ok\n")
sys.exit(1 if a.shard in a.exit_after_marker else 0)
