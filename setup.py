"""Package discovery (the metadata is in pyproject.toml).

Every folder with an `__init__.py` under `radixkv/` is a package, and so are `kernels/` and
`frontend/` (with any subpackages), which install as `radixkv.kernels` and `radixkv.frontend`.
Nothing is listed by hand, so a new subpackage cannot be left out of the wheel;
`tests/test_packaging.py` builds the wheel and the sdist and imports every module from them.
"""

from setuptools import find_packages, setup

MOUNTED = {"radixkv.kernels": "kernels", "radixkv.frontend": "frontend"}  # package -> folder

packages = find_packages(include=["radixkv", "radixkv.*"])
for name, folder in MOUNTED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir={"radixkv": "radixkv", **MOUNTED})
