"""Which packages the wheel holds; everything else about the build is in pyproject.toml.

The design card keeps each part in its own top-level folder. Each folder is
installed as a sub-package of one `rlvitals` namespace, so no generic top-level
name (`actors`, `telemetry`) leaks into site-packages, and every package below
those folders (a folder with an `__init__.py`) is found here, so a new
sub-package ships without anyone having to list it. deploy/ and docs/ are data
packages: the files the commands read at run time (pyproject.toml's
package-data says which) ship inside the wheel and are found through
`importlib.resources`, so an installed rlvitals never looks for a checkout.
"""

from setuptools import find_packages, setup

FOLDERS = {
    "rlvitals": "rlvitals",
    "rlvitals.actors": "actors",
    "rlvitals.learner": "learner",
    "rlvitals.telemetry": "telemetry",
    "rlvitals.dashboards": "dashboards",
    "rlvitals.deploy": "deploy",
    "rlvitals.docs": "docs",
}


def packages() -> list[str]:
    return [f"{name}.{sub}" if sub else name for name, folder in FOLDERS.items()
            for sub in ["", *find_packages(folder)]]


setup(package_dir=FOLDERS, packages=packages())
