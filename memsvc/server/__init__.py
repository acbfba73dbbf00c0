"""The gRPC edge: servicer, authentication, validation, conversion, server lifecycle."""
