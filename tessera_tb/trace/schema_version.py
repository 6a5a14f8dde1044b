"""The format's version. A reader refuses files of a newer major version.

2.0: columns and string tables are compressed with Zstandard (CODEC_ZSTD), which 1.x readers
cannot read. 1.x files (zlib, CODEC_ZLIB) are still read."""

SCHEMA_MAJOR = 2
SCHEMA_MINOR = 0
