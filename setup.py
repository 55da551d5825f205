"""Maps the top-level folders onto the one import namespace ``infernetes.*`` (docs/design.md).

Everything else about the distribution lives in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "infernetes": "infernetes",
    "infernetes.runtime": "runtime",
    "infernetes.operator": "operator",
    "infernetes.kernels": "kernels",
}

packages: list[str] = []
for package, folder in FOLDERS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=FOLDERS, include_package_data=True)
