"""Logging of both server processes (the API process and the engine-core process), from vLLM's
variables read the way vLLM reads them:

- ``VLLM_CONFIGURE_LOGGING=0``: logging is left alone (whoever embeds the server owns it);
- ``VLLM_LOGGING_CONFIG_PATH``: a JSON ``logging.config.dictConfig`` file, applied instead of the
  default setup (vLLM refuses it together with ``VLLM_CONFIGURE_LOGGING=0``, and so do we);
- otherwise one stderr handler on the root logger, our loggers (``infernetes.*``) at
  ``VLLM_LOGGING_LEVEL`` (default INFO), other libraries at WARNING or above, and every line
  starting with ``VLLM_LOGGING_PREFIX``.

``--log-level`` (vLLM's shortcut for the level) wins over ``VLLM_LOGGING_LEVEL``: ``apply_log_level``
writes it into this process's environment, which the engine-core and worker processes inherit, so
every process reads one level the same way (a ``VLLM_LOGGING_CONFIG_PATH`` file still sets its own).

``LoggingSettings.from_env`` checks the variables (once, before anything loads, so a bad one is a
startup error); ``configure_logging`` applies them and may be called again (it replaces its own
handler).
"""

from __future__ import annotations

import json
import logging
import logging.config
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infernetes.schema.env import read_env

OUR_LOGGER = "infernetes"
HANDLER_NAME = "infernetes-default"
FORMAT = "%(levelname)s %(asctime)s {tag}%(name)s: %(message)s"


@dataclass(frozen=True)
class LoggingSettings:
    configure: bool = True
    level: str = "INFO"
    prefix: str = ""
    config_path: str | None = None
    dict_config: Mapping[str, Any] | None = None  # the file's content, read at check time

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LoggingSettings:
        """The settings from the environment; ``ValueError`` naming the variable when they
        contradict each other or the config file cannot be used."""
        environ = os.environ if environ is None else environ
        configure = bool(read_env("VLLM_CONFIGURE_LOGGING", environ))
        path = read_env("VLLM_LOGGING_CONFIG_PATH", environ)
        if path and not configure:
            raise ValueError(
                "VLLM_LOGGING_CONFIG_PATH is set but VLLM_CONFIGURE_LOGGING=0: the config file means "
                "configuring logging; unset one of them"
            )
        return cls(
            configure=configure,
            level=read_env("VLLM_LOGGING_LEVEL", environ),
            prefix=read_env("VLLM_LOGGING_PREFIX", environ),
            config_path=path,
            dict_config=_read_dict_config(path) if path else None,
        )


def apply_log_level(log_level: str | None) -> None:
    """``--log-level``, when given, as ``VLLM_LOGGING_LEVEL`` for this process and its children."""
    if log_level:
        os.environ["VLLM_LOGGING_LEVEL"] = log_level


def _read_dict_config(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        raise ValueError(f"VLLM_LOGGING_CONFIG_PATH={path}: no such file")
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(
            f"VLLM_LOGGING_CONFIG_PATH={path}: not a readable JSON file ({error})"
        ) from error
    if not isinstance(content, dict):
        raise ValueError(
            f"VLLM_LOGGING_CONFIG_PATH={path}: expected a JSON object (a logging dictConfig), "
            f"got {type(content).__name__}"
        )
    return content


def configure_logging(settings: LoggingSettings, tag: str = "") -> None:
    """Apply ``settings`` in this process; ``tag`` (e.g. ``core pid 42``) marks its lines."""
    if not settings.configure:
        return
    if settings.dict_config is not None:
        logging.config.dictConfig(dict(settings.dict_config))
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(HANDLER_NAME)
    handler.setFormatter(
        logging.Formatter(settings.prefix + FORMAT.format(tag=f"[{tag}] " if tag else ""))
    )
    root.addHandler(handler)
    level = logging.getLevelName(settings.level)
    root.setLevel(max(level, logging.WARNING))
    logging.getLogger(OUR_LOGGER).setLevel(level)
