"""The user's commands: ``gpuguard ps``, ``run`` (also placed on a Swarm) and ``nodes``.

Clients of the services' HTTP APIs and of the docker CLI; they import no service package
(tests/unit/test_architecture.py), so the services stay free to change inside.
"""
