"""Stage 1: raw videos -> webdataset shards of JPEG frames + Parquet manifests.

``datasets`` (the adapter table: dataset name -> lister + layout; listers in ``official`` and ``folder``,
their result in ``listing``), ``splits`` (drawn train/val/test splits), ``transcode`` (ffmpeg -> JPEG frames), ``shards`` (atomic
tar writer), ``manifest`` (schema, readers, ``verify``), ``run`` (``preprocess`` and ``merge``).
"""
