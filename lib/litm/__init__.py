"""litm: reproduce and dissect the lost-in-the-middle effect (Liu et al., TACL 2024) on open models."""
from .errors import ConfigError, DataError, FetchError, LitmError, ModelError
from . import profiles
from .experiment import SweepConfig, summarize, sweep
from .models import load_model
from .types import Document, Example

__version__ = "0.1.0"
__all__ = ["Document", "Example", "SweepConfig", "sweep", "summarize", "load_model", "LitmError", "DataError",
           "ConfigError", "ModelError", "FetchError", "__version__"]
