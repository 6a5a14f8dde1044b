"""The format's version. A reader refuses files of a newer major version."""

SCHEMA_MAJOR = 1
SCHEMA_MINOR = 0
