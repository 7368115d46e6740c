"""Thin Lambda handlers: parse the event, call the core in swarm/, map the result."""

from __future__ import annotations

import logging
import os

from aws_lambda_powertools import Logger

#: the level the stack configures (observability.log_level), set on every function
LOG_LEVEL_VAR = "POWERTOOLS_LOG_LEVEL"


def service_logger() -> Logger:
    """A Powertools Logger at ``POWERTOOLS_LOG_LEVEL``, even under Lambda's log-level filter.

    Lambda sets ``AWS_LAMBDA_LOG_LEVEL`` from the function's ApplicationLogLevel, and Powertools
    prefers it over ``POWERTOOLS_LOG_LEVEL``. The stack keeps that filter at INFO (or DEBUG) so
    it never drops the metric (EMF) lines, which Lambda counts as INFO (infra.functions
    .lambda_log_level); the configured level is applied here, on the Logger, instead.
    """
    logger = Logger()
    level = os.environ.get(LOG_LEVEL_VAR, "").strip().upper()
    if level:
        logging.getLogger(logger.name).setLevel(level)
        # what a sampled invocation (POWERTOOLS_LOGGER_SAMPLE_RATE) resets the level to
        logger.initial_log_level = level
    return logger
