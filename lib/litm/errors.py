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


class StatsError(LitmError):
    """A statistic was asked of data that cannot support it (unpaired, empty, mixed configs)."""
