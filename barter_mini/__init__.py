"""barter_mini: structured dynamic sparse training (BARTER) for vision transformers."""

__version__ = "0.1.0"
