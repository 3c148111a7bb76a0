"""The one build rule pyproject.toml cannot state: the wheel's ``workshop_lib.dataset`` is the table, not its script.

pyproject.toml holds the whole configuration and maps the package ``workshop_lib.dataset`` to the top-level
``dataset/`` folder (``package-dir``), whose CSV is package data. setuptools builds every ``*.py`` of a package's
folder into the wheel, and no setting leaves one out (``exclude-package-data`` is for data files), so
``dataset/make_b3db.py``, the maintainers' script that regenerates the table, would install as a module of the
package. This keeps only the folder's ``__init__.py``; tests/integration/test_layers.py checks the wheel.
"""

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_ONLY = "workshop_lib.dataset"  # dataset/: its modules other than __init__ stay out of the wheel


class BuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if package != DATA_ONLY or m[1] == "__init__"]  # (package, module, file)


setup(cmdclass={"build_py": BuildPy})
