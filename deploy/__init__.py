"""The runtime files of `rlvitals stack`, shipped in the wheel as the data package `rlvitals.deploy`.

No code lives here. This file only makes deploy/ a package so that its
Prometheus configuration and alert rules, Grafana provisioning and compose file
are installed with rlvitals and found through the import system
(`importlib.resources.files("rlvitals.deploy")`) wherever rlvitals is
installed; pyproject.toml lists which files ship.
"""
