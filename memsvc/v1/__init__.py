"""Generated gRPC code for memsvc.v1 (stable import path: memsvc.v1.memory_pb2)."""
