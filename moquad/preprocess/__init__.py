"""Stage 1: raw videos -> webdataset shards of JPEG frames + Parquet manifests.

``datasets`` (layouts -> video list), ``transcode`` (ffmpeg -> JPEG frames), ``shards`` (atomic
tar writer), ``manifest`` (schema, readers, ``verify``), ``run`` (``preprocess`` and ``merge``).
"""
