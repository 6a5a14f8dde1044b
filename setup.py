"""One distribution, two import packages: tessera_tb (trace processing + plugin) and tessera."""

import sys

from setuptools import Extension, find_packages, setup

_TB_PACKAGES = find_packages(include=["tessera_tb", "tessera_tb.*"])
_CAPTURE_PACKAGES = find_packages(where="capture", include=["tessera", "tessera.*"])

# The Kineto trace scanner in C (tessera_tb/importers/_kineto_scan.c): it reads a trace's
# events straight into columns, several times faster than decoding them into Python objects.
# Optional: where no C compiler is at hand the install goes on without it, and the importer
# takes its pure-Python path (same results, slower; docs/ARCHITECTURE.md).
_SCANNER = Extension(
    "tessera_tb.importers._kineto_scan",
    sources=["tessera_tb/importers/_kineto_scan.c"],
    extra_compile_args=["-O2"],
    optional=True,
)
# A step's columns packed in C (tessera_tb/trace/_colpack.c: differences, byte planes and
# Zstandard, which it loads at run time from the zstandard package, hence libdl), the GIL
# released: steps encoded in threads then run side by side. Optional too: without it
# trace/columns.py packs the same bytes with numpy and the zstandard package.
_COLPACK = Extension(
    "tessera_tb.trace._colpack",
    sources=["tessera_tb/trace/_colpack.c"],
    extra_compile_args=["-O2"],
    libraries=["dl"] if sys.platform.startswith("linux") else [],
    optional=True,
)

setup(
    name="tessera-profiler",
    version="0.1.0",
    description="GPU profiler for TensorBoard: per-step traces, operator timeline, top-k, "
    "roofline, stalls and collectives",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=_TB_PACKAGES + _CAPTURE_PACKAGES,
    package_dir={"tessera": "capture/tessera"},
    ext_modules=[_SCANNER, _COLPACK],
    package_data={"tessera_tb": ["proto/*.proto", "proto/*.pyi", "frontend/*"]},
    install_requires=[
        "tensorboard>=2.21",
        "protobuf>=6.31.1,<8",
        "numpy>=1.24",
        "pandas>=2.0",
        "plotly>=5.0",
        "werkzeug>=2.0",
        # Typed JSON decoding: 3-5x faster than json.load on Kineto traces and no
        # intermediate dicts for the event envelope (bench/ingest.py measures it).
        "msgspec>=0.18",
        # ISA-L's inflate for the step files' columns and gzip traces: ~2x faster reads than
        # zlib (trace/columns.py falls back to zlib where it is missing).
        "isal>=1.6",
        # Zstandard for the step files' columns (schema 2.0): 3x faster to write than zlib's
        # level 1, the compressed columns 19% smaller and the step files 7-9% (docs/FORMAT.md,
        # "Columns"). Deterministic: one import always writes the same bytes.
        "zstandard>=0.23",
    ],
    extras_require={
        "torch": ["torch"],
        "nvml": ["nvidia-ml-py"],
        # Logdirs, runs and bundles on object storage (s3://, gs://) through fsspec.
        "s3": ["fsspec>=2023.6", "s3fs>=2023.6"],
        "gcs": ["fsspec>=2023.6", "gcsfs>=2023.6"],
        # Import and cross-rank analyses on a Dask cluster (--dask, analyze.*(dask=...)).
        "dask": ["dask[distributed]>=2024.1"],
        # OpenTelemetry export (profile.otlp, tessera-prof export --otlp).
        "otlp": ["opentelemetry-sdk>=1.30", "opentelemetry-exporter-otlp-proto-http>=1.30"],
        # playwright drives the system's Chromium (apt-get install chromium) in the plugin's
        # browser tests; it never downloads a browser of its own here. moto runs a local
        # S3-compatible server for the s3:// tests (boto3 is what TensorBoard reads S3 with).
        "test": [
            "pytest>=8",
            "ruff>=0.17,<0.18",
            "playwright==1.65.2",
            "moto[server]>=5.0",
            "boto3>=1.34",
            "fsspec>=2023.6",
            "s3fs>=2023.6",
            "dask[distributed]>=2024.1",
            # The NVML sampler's "no driver" path is tested on machines without a GPU.
            "nvidia-ml-py",
            # OTLP export, and the test receiver's decoding of the payloads.
            "opentelemetry-sdk>=1.30",
            "opentelemetry-exporter-otlp-proto-http>=1.30",
            "opentelemetry-proto>=1.30",
        ],
    },
    entry_points={
        "console_scripts": ["tessera-prof=tessera.cli.main:main"],
        "tensorboard_plugins": ["tessera = tessera_tb.plugin_loader:TesseraLoader"],
    },
)
