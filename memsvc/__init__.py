"""memsvc: low-latency long-term memory for voice and chat agents."""

__version__ = "0.1.0"
