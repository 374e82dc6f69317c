"""TensorFold stand-in: the engine sparkfleet's lab builds and runs in place of TensorFold."""

__version__ = "0.1.0"
