"""lait: build web-scale image-text datasets with the LAIT pipeline and train ImageBERT on them."""

__version__ = "0.1.0"
