"""Shard uploads to S3: the direct multipart upload (``objstore.upload``) beside the previous scheme (pyarrow's
stream to a temporary key, then ``fs.move``: one CopyObject, which S3 caps at 5 GiB), against a local S3-API server
(moto, behind the tests' counting proxy) in this process.

Rows per file size: wall seconds (median of ``--repeats``, each a fresh key), the ratio to the previous scheme
measured in the same process, the bytes the client sent per file byte (the proxy counts PUT bodies), and the
CopyObject requests. moto keeps objects in memory and copies them itself: the times show the client and moto on this
machine, not a real network; what carries over is the copy count and the bytes sent.
Run: ``nice python benchmarks/bench_upload.py`` (~1 min on 2 cores; needs moto: ``pip install -e '.[dev]'``). The table
goes to ``docs/results/bench_upload.json`` (``--record``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from moquad import objstore
from moquad.record import Record, add_argument


def previous_upload(local: Path, url: str) -> None:
    """The scheme before: pyarrow's multipart stream to a temporary key, then fs.move (CopyObject + delete)."""
    fs, path = objstore._split(url)
    temp = f"{path}.partial-{uuid.uuid4().hex[:12]}"
    with open(local, "rb") as src, fs.open_output_stream(temp) as dst:
        while chunk := src.read(1 << 24):
            dst.write(objstore.arrow_copy(chunk))
    fs.move(temp, path)


def measure(proxy, fn, local: Path, repeats: int) -> tuple[float, float, int]:  # noqa: ANN001 - the test proxy
    """(median seconds, client bytes sent per file byte, CopyObject requests per upload) of ``fn``."""
    times, sent, copies = [], [], []
    for _ in range(repeats):
        proxy.reset()
        t = time.perf_counter()
        fn(local, f"s3://bkt/bench-upload/{uuid.uuid4().hex}.tar")
        times.append(time.perf_counter() - t)
        sent.append(proxy.put_bytes / local.stat().st_size)
        copies.append(proxy.copies)
    return statistics.median(times), statistics.median(sent), max(copies)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--repeats", type=int, default=3)
    add_argument(ap, "bench_upload")
    args = ap.parse_args()
    rec = Record("bench_upload")
    from s3server import s3_server

    rows = []
    with s3_server() as proxy, tempfile.TemporaryDirectory(prefix="moquad-bench-upload-") as tmp:
        objstore.reset()
        for mb in args.sizes_mb:
            local = Path(tmp) / f"{mb}.tar"
            local.write_bytes(os.urandom(mb << 20))
            old = measure(proxy, previous_upload, local, args.repeats)
            new = measure(proxy, objstore.upload, local, args.repeats)
            rows.append((mb, old, new))
    rec.table("upload", ["file", "temp key + move, s", "direct multipart, s", "ratio", "bytes sent per byte",
                         "CopyObject per upload"],
              [[f"{mb} MiB", f"{old[0]:.2f}", f"{new[0]:.2f}", f"{old[0] / new[0]:.2f}x", f"{old[1]:.2f} / {new[1]:.2f}",
                f"{old[2]} / {new[2]}"] for mb, old, new in rows],
              title="Shard uploads to a local S3-API server: the previous scheme against the direct multipart upload "
                    "(ratio: previous / direct; pairs: previous / direct)")
    rec.write(args.record)


if __name__ == "__main__":
    main()
