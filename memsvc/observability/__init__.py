"""What every layer reports through: metrics, the metrics endpoint, log format, GC pauses."""
