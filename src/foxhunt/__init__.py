"""foxhunt: train trading models on Databento order-book data, on Kubeflow Pipelines."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("foxhunt")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+src"
