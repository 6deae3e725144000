# The one place the version is written: pyproject.toml (scikit-build-core's
# regex provider) and CMakeLists.txt (the extension's build facts) read it.
__version__ = "0.1.0"
