"""The package list, which pyproject.toml cannot state: configs/ stays at the top of the repository and
installs as the package data alibi_lm/configs (a package-dir mapping), so that a wheel finds its configs
inside the package. setuptools' discovery in pyproject.toml finds only folders under alibi_lm/; each
config group folder is listed too, as setuptools wants for a folder of data files."""

from setuptools import find_namespace_packages, find_packages, setup

config_groups = [f"alibi_lm.configs.{group}" for group in find_namespace_packages(where="configs")]
setup(
    packages=[*find_packages(include=["alibi_lm", "alibi_lm.*"]), "alibi_lm.configs", *config_groups],
    package_dir={"alibi_lm.configs": "configs"},
)
