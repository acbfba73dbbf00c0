"""The explicit memory operations: Remember, Correct, Forget, ListMemories, GetMemoryHistory."""
