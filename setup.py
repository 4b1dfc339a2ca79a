"""The wheel's layout: the ``gpuguard`` package, and the design's top-level data folders
(``rules/``, ``grafana/dashboards/``, ``deploy/``) installed inside it as package data."""

from setuptools import find_packages, setup

DATA_PACKAGES = {
    "gpuguard.rules": "rules",
    "gpuguard.dashboards": "grafana/dashboards",
    "gpuguard.deploy.prometheus": "deploy/prometheus",
    "gpuguard.deploy.alertmanager": "deploy/alertmanager",
}

setup(
    # gpusim's device profiles and C sources are folders of data inside the package
    packages=[
        *find_packages(include=["gpuguard", "gpuguard.*"]),
        "gpuguard.gpusim.native",
        "gpuguard.gpusim.profiles",
        *DATA_PACKAGES,
    ],
    package_dir=DATA_PACKAGES,
)
