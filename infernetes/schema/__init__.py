"""The one server-argument schema: every ``serve`` argument and ``VLLM_*`` variable, as data.

Submodules import only the standard library (and PyYAML when a ``--config`` file is read), so the
operator and ``--help`` can use them without torch. See docs/architecture.md for the API.
"""
