"""The one thing pyproject.toml cannot say: the top-level resources/ folder goes into the package as macapp/resources.

The catalog, icon, style sheet and Info.plist sit at the top of the repository (beside macapp/, packaging/, tests/)
and travel inside the wheel, where `macapp.core.paths.resources_dir` finds them through importlib.resources.
"""

from setuptools import find_namespace_packages, setup

setup(
    # the developer's tools (screenshots, the probe) run from a checkout, not a wheel
    packages=[*find_namespace_packages(include=["macapp*"], exclude=["macapp.devtools*"]), "macapp.resources"],
    package_dir={"macapp.resources": "resources"},
    package_data={"macapp.resources": ["*"]},
)
