"""sparkfleet: provision two or three DGX Sparks into one DeepSeek V4.1 Flash server."""

__version__ = "2.0.0"
