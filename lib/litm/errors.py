"""The one exception type users see: every error a user can cause is a LitmError."""


class LitmError(Exception):
    """A problem with the user's input or environment, with what to do about it."""


class DataError(LitmError):
    """A data file is missing, malformed, or lacks a field we need."""


class ConfigError(LitmError):
    """An experiment configuration asks for something impossible."""


class ModelError(LitmError):
    """A model cannot be found or loaded."""


class FetchError(LitmError):
    """A download failed or a downloaded file does not verify."""


class LockedError(LitmError):
    """Another process is writing the same results folder."""


class StatsError(LitmError):
    """A statistic was asked of data that cannot support it (unpaired, empty, mixed configs)."""


def check_distinct(**lists) -> None:
    """A ConfigError naming the first list given that holds a value twice (a position, seed, depth, order or
    budget asked for twice would score and store the same prompts twice)."""
    for name, values in lists.items():
        values = list(values or ())
        twice = sorted({v for v in values if values.count(v) > 1}, key=str)
        if twice:
            raise ConfigError(f"{name} lists {twice} more than once: give each value once (got {values}).")
