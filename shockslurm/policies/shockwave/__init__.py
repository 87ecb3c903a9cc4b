"""Shockwave: a volatile Fisher market with Bayesian forecasts of dynamic adaptation."""

from .config import ShockwaveConfig
from .planner import Shockwave

__all__ = ["Shockwave", "ShockwaveConfig"]
