"""Qwen Desk: run the Qwen3.5 family locally on an Apple Silicon Mac."""

__version__ = "0.1.0"
APP_NAME = "Qwen Desk"
